"""Drains an operator asks for: ``POST /api/fleet/hosts/{id}/drain`` before maintenance, or when
a cloud gives notice that it takes a spot host back; ``DELETE`` reopens the host.

A drain closes the host to new replicas and cells at once, then moves its replicas away one
kernel at a time, add-first with state kept (`GroupKeeper.drain_host`), in the background: the
request answers as soon as the host is closed, and the host's admin model follows the drain
(`model`). A drained host stays closed until its agent stops (the operator's next step), it is
lost, or it is reopened. What the platform cannot move is refused before anything moves (a
single-replica kernel there, a replica arriving there, a host not alive): 409, naming it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from kernelfleet.errors import Conflict
from kernelfleet.gateway.hosts import HostRegistry

log = logging.getLogger("kernelfleet.gateway.hosts")


class DrainState(enum.Enum):
    MOVING = "moving"
    """Replicas are being moved away."""
    DRAINED = "drained"
    """None is left: the host's agent may be stopped."""
    FAILED = "failed"
    """A move failed, or the host was lost: it takes work again if it is alive (`error`
    says why)."""


class Drainable(Protocol):
    """What a drain needs of the kernel service."""

    def check_drainable(self, host_id: str) -> int: ...
    def drain_host(self, host_id: str) -> Awaitable[None]: ...
    def reopen_host(self, host_id: str) -> bool: ...
    def replicas_on(self, host_id: str) -> int: ...


@dataclass
class Drain:
    """One operator drain of one host."""

    why: str
    replicas: int
    """How many replicas it had to move."""
    state: DrainState = DrainState.MOVING
    error: str | None = None
    task: asyncio.Future[None] | None = None
    """The moves; kept here, since the event loop keeps only a weak reference."""


class HostDrains:
    """The drains operators asked for, by host id; see the module docstring."""

    def __init__(self, kernels: Drainable, hosts: HostRegistry) -> None:
        self._kernels = kernels
        self._hosts = hosts
        self._drains: dict[str, Drain] = {}

    def start(self, host_id: str, why: str) -> Drain:
        """Close `host_id` and move its replicas away in the background; the drain under way
        if there is one. `NotFound` or `Conflict` (nothing moved) as `check_drainable` says."""
        drain = self._drains.get(host_id)
        if drain is not None and drain.state is DrainState.MOVING:
            return drain
        replicas = self._kernels.check_drainable(host_id)
        drain = Drain(why=why, replicas=replicas)
        self._drains[host_id] = drain
        drain.task = asyncio.ensure_future(self._run(host_id, drain))
        log.warning("host %s: draining %d replica(s) (%s)", host_id, replicas, why)
        return drain

    async def _run(self, host_id: str, drain: Drain) -> None:
        try:
            await self._kernels.drain_host(host_id)
        except Exception as e:
            drain.state, drain.error = DrainState.FAILED, str(e)
            log.error("host %s: the drain failed, the host takes work again: %s", host_id, e)
            return
        drain.state = DrainState.DRAINED
        log.warning("host %s: drained (%s); its agent may be stopped", host_id, drain.why)

    def reopen(self, host_id: str) -> None:
        """`host_id` takes work again (what moved stays moved). `Conflict` while its drain
        still moves replicas (a move is not stopped half-way), or if it is not draining."""
        drain = self._drains.get(host_id)
        if drain is not None and drain.state is DrainState.MOVING:
            raise Conflict(
                f"host {host_id} is still moving {self._kernels.replicas_on(host_id)} "
                "replica(s) away: reopen it once its drain is over"
            )
        self._drains.pop(host_id, None)
        if not self._kernels.reopen_host(host_id) and drain is None:
            raise Conflict(f"host {host_id} is not draining")
        log.warning("host %s: reopened, it takes work again", host_id)

    def model(self, host_id: str) -> dict[str, Any] | None:
        """The host's drain as the admin API shows it (None: no operator drain, or the host
        takes work again after a drain that ended: its agent came back, say)."""
        drain = self._drains.get(host_id)
        if drain is None:
            return None
        if drain.state is DrainState.DRAINED and self._hosts.get(host_id).takes_work:
            del self._drains[host_id]
            return None
        return {
            "state": drain.state.value,
            "why": drain.why,
            "replicas": drain.replicas,
            "left": self._kernels.replicas_on(host_id),
            "error": drain.error,
        }
