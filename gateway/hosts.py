"""The gateway's view of its host agents, kept current by their heartbeats.

A host agent registers and heartbeats with one idempotent call (``PUT /api/fleet/hosts/{id}``)
carrying its GPUs and replicas. A host that misses heartbeats for ``heartbeat_timeout`` seconds is
LOST; a heartbeat brings it back to ALIVE.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import InvalidRequest, NotFound
from kernelfleet.kernels.agent.client import HostAgentClient

log = logging.getLogger("kernelfleet.gateway.hosts")


class HostState(enum.Enum):
    ALIVE = "alive"
    LOST = "lost"


_HOST_TRANSITIONS = {
    HostState.ALIVE: {HostState.LOST},
    HostState.LOST: {HostState.ALIVE},
}


@dataclass
class HostRecord:
    """One registered host agent."""

    id: str
    address: str
    client: HostAgentClient
    gpus: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    instance: str | None = None
    state: HostState = HostState.ALIVE
    last_seen: float = 0.0

    def move_to(self, state: HostState) -> None:
        if state not in _HOST_TRANSITIONS[self.state]:
            raise RuntimeError(
                f"host {self.id}: illegal transition {self.state.value} -> {state.value}"
            )
        self.state = state

    @property
    def alive(self) -> bool:
        return self.state is HostState.ALIVE


class HostRegistry:
    """Registered hosts by id. Callers pass ``now`` (monotonic seconds) so tests can drive time."""

    def __init__(
        self,
        token: str,
        heartbeat_timeout: float,
        on_report: Callable[[HostRecord, bool], None],
        on_lost: Callable[[HostRecord], None],
    ) -> None:
        self._token = token
        self._heartbeat_timeout = heartbeat_timeout
        self._on_report = on_report
        self._on_lost = on_lost
        self._hosts: dict[str, HostRecord] = {}

    def report(self, host_id: str, body: dict[str, Any], now: float) -> HostRecord:
        """Record a heartbeat (the first one registers the host).

        `on_report` gets the host and whether its agent restarted since the last report (its
        ``instance`` changed): then replicas it no longer lists are gone, not merely unlisted.
        """
        address = body.get("address")
        if not isinstance(address, str) or not address.startswith(("http://", "https://")):
            raise InvalidRequest("a host report needs 'address', the agent's http(s) URL")
        if body.get("id", host_id) != host_id:
            raise InvalidRequest(
                f"the report names host {body.get('id')!r} but was sent for {host_id!r}"
            )
        gpus, replicas = body.get("gpus", []), body.get("replicas", [])
        if not isinstance(gpus, list) or not isinstance(replicas, list):
            raise InvalidRequest("'gpus' and 'replicas' must be lists")
        host = self._hosts.get(host_id)
        if host is None:
            host = HostRecord(
                id=host_id, address=address, client=HostAgentClient(address, self._token)
            )
            self._hosts[host_id] = host
            log.info("host %s registered at %s with %d GPU(s)", host_id, address, len(gpus))
        if host.address != address:
            host.client.close()
            host.address, host.client = address, HostAgentClient(address, self._token)
        if not host.alive:
            host.move_to(HostState.ALIVE)
            log.warning("host %s is back after missing its heartbeats", host_id)
        instance = body.get("instance")
        restarted = host.instance is not None and instance != host.instance
        if restarted:
            log.warning(
                "host %s restarted (agent instance %s -> %s)", host_id, host.instance, instance
            )
        host.gpus, host.replicas, host.instance, host.last_seen = gpus, replicas, instance, now
        self._on_report(host, restarted)
        return host

    def check_liveness(self, now: float) -> list[HostRecord]:
        """Mark hosts silent for longer than the heartbeat timeout LOST; return them."""
        lost = []
        for host in self._hosts.values():
            if host.alive and now - host.last_seen > self._heartbeat_timeout:
                host.move_to(HostState.LOST)
                log.error(
                    "host %s missed its heartbeats for %.1f s: marked lost",
                    host.id,
                    now - host.last_seen,
                )
                self._on_lost(host)
                lost.append(host)
        return lost

    def forget(self, host_id: str) -> None:
        """Drop a host that was stopped on purpose (scaled in), at once rather than after its
        heartbeats stop. If it was alive, `on_lost` runs first, so whatever it still held is
        handled as lost. Unknown ids are ignored: a host is forgotten once."""
        host = self._hosts.get(host_id)
        if host is None:
            return
        if host.alive:
            host.move_to(HostState.LOST)
            self._on_lost(host)
        del self._hosts[host_id]
        host.client.close()
        log.info("host %s forgotten: it was stopped", host_id)

    def get(self, host_id: str) -> HostRecord:
        try:
            return self._hosts[host_id]
        except KeyError:
            raise NotFound(f"no host with id {host_id!r}") from None

    def all(self) -> list[HostRecord]:
        return sorted(self._hosts.values(), key=lambda host: host.id)

    def close(self) -> None:
        for host in self._hosts.values():
            host.client.close()
