"""The autoscaler: executes the policy's autoscaling decisions through a `HostProvider`.

Each round (`run_once`) takes a fresh `FleetSnapshot`, asks ``policy.autoscale`` and acts:

- `ScaleOut(n)`: start up to `n` hosts, within ``max_hosts`` (alive and pending hosts count),
  each of the provider's kind, or with ``spot_share`` spot or on-demand as `kind_to_add` says;
- `ScaleIn(ids)`: a chosen host this provider did not start (started by hand, say) is swapped
  for the provider's idle host with the fewest replicas that was not chosen, if any. Then for
  each host, within ``min_hosts``: skip it if it has a committed GPU (or is still not the
  provider's); ``await drain(host_id)`` (the caller closes it to new work and migrates its
  replicas away) and re-check that it holds none; then stop it. A drained host that cannot be
  stopped stays closed to new work.

A decision is acted on only once the policy gave the same kind of decision ``patience`` rounds
in a row (sustained demand, not a blip), and no sooner than ``cooldown`` seconds after the last
round that started or stopped a host. Hosts the provider started that the snapshot does not yet
show alive count as pending. A host it removes is told to the fleet (``hosts``, a
`HostRetirement`: the gateway's host registry) as it goes: stopping, then forgotten, so the
fleet's snapshots stop counting it at once. Without ``hosts`` (a snapshot source that cannot be
told), hosts stopped here are shown dead until the snapshot no longer lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kernelfleet.errors import FleetError
from kernelfleet.gateway.demand import LiveDemand
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.host_provider import HostProvider
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.scheduler.decisions import AutoscaleDecision, Hold, ScaleIn, ScaleOut
from kernelfleet.scheduler.hostkinds import SPOT, kind_to_add
from kernelfleet.scheduler.policy import Policy
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot

log = logging.getLogger("kernelfleet.gateway.autoscaler")


class HostRetirement(Protocol):
    """Who the autoscaler tells about a host it removes (the gateway's `HostRegistry`)."""

    def stopping(self, host_id: str) -> None:
        """`host_id` is drained and about to be stopped: it takes no work from now on."""

    def forget(self, host_id: str) -> None:
        """`host_id` was stopped: drop it now rather than when its heartbeats stop."""


@dataclass(frozen=True)
class AutoscaleRound:
    """What one round decided and did. ``skipped`` pairs a host id (or ``"scale-out"``) with
    why it was not acted on."""

    decision: AutoscaleDecision
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


class Autoscaler:
    """Runs autoscaling rounds; see the module docstring. One round at a time."""

    def __init__(
        self,
        snapshot: Callable[[], FleetSnapshot],
        policy: Policy,
        provider: HostProvider,
        drain: Callable[[str], Awaitable[None]],
        *,
        clock: Callable[[], float] = time.monotonic,
        cooldown: float = 60.0,
        patience: int = 1,
        min_hosts: int = 0,
        max_hosts: int = 0,
        metrics: FleetMetrics | None = None,
        hosts: HostRetirement,
        events: EventBus | None = None,
        demand: LiveDemand | None = None,
        spot_share: float = 0.0,
    ) -> None:
        if patience < 1 or cooldown < 0 or min_hosts < 0 or max_hosts < 0:
            raise ValueError("patience must be >= 1; cooldown and host limits >= 0")
        if not 0 <= spot_share <= 1:
            raise ValueError(f"spot_share must be within [0, 1], not {spot_share}")
        if max_hosts and min_hosts > max_hosts:
            raise ValueError(f"min_hosts {min_hosts} exceeds max_hosts {max_hosts}")
        self._snapshot = snapshot
        self.policy = policy
        self.provider = provider
        self._drain = drain
        self._clock = clock
        self.cooldown = cooldown
        self.patience = patience
        self.min_hosts = min_hosts
        self.max_hosts = max_hosts
        self._metrics = metrics
        self._hosts = hosts
        self._events = events or EventBus()
        self.demand = demand
        self.spot_share = spot_share
        """Above 0: each host added is spot while spot hosts stay within this share of the
        fleet (alive and being added), on-demand otherwise (`kind_to_add`, as the simulator
        adds them); 0: every host is of the provider's own kind."""
        self._kinds: dict[str, str] = {}
        """The kind each host this autoscaler asked for was started as."""
        self._lock = asyncio.Lock()
        self._last_action: float | None = None
        self._streak: tuple[type, int] = (Hold, 0)
        self._first_seen: dict[str, float] = {}
        self._idle_since: dict[str, float] = {}
        self.last_round: AutoscaleRound | None = None
        """The latest round that decided anything but `Hold`."""

    def snapshot(self) -> FleetSnapshot:
        """The caller's snapshot, completed with what only the autoscaler knows: hosts it is
        adding (pending), hosts it stopped (dead), the size of a new host, its clock with
        each host's age and idle time as these rounds saw them (`_dated`), and with a demand
        model its prediction (observing busy GPUs and kernels now)."""
        snapshot = self._snapshot()
        pending = self.pending({host.id for host in snapshot.hosts if host.alive})
        now = self._clock()
        if self.demand is not None:
            predicted = self.demand.predicted_gpus(snapshot.gpus_committed)
            snapshot = dataclasses.replace(snapshot, predicted_gpus=predicted)
        return dataclasses.replace(
            snapshot,
            hosts=self._dated(snapshot.hosts, now),
            now=now,
            hosts_pending=max(snapshot.hosts_pending, pending),
            gpus_per_host=snapshot.gpus_per_host or self.provider.gpus_per_host,
        )

    def _dated(self, hosts: tuple[HostSnapshot, ...], now: float) -> tuple[HostSnapshot, ...]:
        """`hosts` with ``started_at`` (when a round first saw the host) and ``idle_since`` (when
        a round first saw it with no committed GPU) where the caller left them unknown: the
        rule's idle time and minimum lifetime (`AutoscaleConfig`) count from there."""
        seen = {host.id for host in hosts}
        for forgotten in set(self._first_seen) - seen:
            del self._first_seen[forgotten]
            self._idle_since.pop(forgotten, None)
        dated = []
        for host in hosts:
            started = self._first_seen.setdefault(host.id, now)
            if host.gpus_committed:
                self._idle_since.pop(host.id, None)
            idle = self._idle_since.setdefault(host.id, now) if not host.gpus_committed else now
            if host.started_at == -math.inf and host.idle_since == -math.inf:
                host = dataclasses.replace(host, started_at=started, idle_since=idle)
            dated.append(host)
        return tuple(dated)

    def model(self) -> dict[str, Any]:
        """What the admin API shows of the autoscaler: its limits, the hosts it runs, and its
        latest round that decided anything but holding."""
        last = self.last_round
        return {
            "min_hosts": self.min_hosts,
            "max_hosts": self.max_hosts,
            "gpus_per_host": self.provider.gpus_per_host,
            "hosts_started": list(self.provider.hosts()),
            "demand_model": None if self.demand is None else self.demand.describe(),
            "spot_share": self.spot_share,
            "last_round": None
            if last is None
            else {
                "decision": _describe(last.decision),
                "started": list(last.started),
                "stopped": list(last.stopped),
                "skipped": [{"subject": subject, "why": why} for subject, why in last.skipped],
            },
        }

    def pending(self, alive: set[str]) -> int:
        """Hosts the provider started that are not among the `alive` ones yet."""
        return sum(1 for host_id in self.provider.hosts() if host_id not in alive)

    def addable_host_size(self, hosts: int) -> int:
        """GPUs of a host it could add to a fleet of `hosts` (alive and pending); 0 at
        ``max_hosts``."""
        room = not self.max_hosts or hosts < self.max_hosts
        return self.provider.gpus_per_host if room else 0

    async def run_once(self) -> AutoscaleRound:
        """One round: decide, then act if patience and cooldown allow."""
        result = await self._round()
        if not isinstance(result.decision, Hold):
            self.last_round = result
            self._publish(result)
        return result

    def _publish(self, result: AutoscaleRound) -> None:
        """An ``autoscaler-decision`` event for a round that did not hold."""
        action = "scale-out" if isinstance(result.decision, ScaleOut) else "scale-in"
        reasons = [f"{subject}: {why}" for subject, why in result.skipped]
        if result.started or result.stopped:
            done = [f"started {h}" for h in result.started] + [
                f"stopped {h}" for h in result.stopped
            ]
            asked = f"the policy asked {self.patience} round(s) in a row"
            reasons.insert(0, f"{asked}; {', '.join(done)}")
        self._events.publish(
            EventType.AUTOSCALER_DECISION,
            {
                "action": action,
                "reason": "; ".join(reasons) or "nothing to do",
                "decision": _describe(result.decision),
                "started": list(result.started),
                "stopped": list(result.stopped),
            },
        )

    async def _round(self) -> AutoscaleRound:
        async with self._lock:
            snapshot = self.snapshot()
            decision = self.policy.autoscale(snapshot)
            kind, count = self._streak
            self._streak = (type(decision), count + 1 if type(decision) is kind else 1)
            if isinstance(decision, Hold):
                return AutoscaleRound(decision)
            if self._streak[1] < self.patience:
                why = f"decided {self._streak[1]} of {self.patience} rounds in a row"
                return AutoscaleRound(decision, skipped=(("round", why),))
            now = self._clock()
            if self._last_action is not None and now - self._last_action < self.cooldown:
                why = f"cooling down until {self._last_action + self.cooldown:.1f}"
                return AutoscaleRound(decision, skipped=(("round", why),))
            if isinstance(decision, ScaleOut):
                result = await self._scale_out(snapshot, decision)
            else:
                result = await self._scale_in(snapshot, decision)
            if result.started or result.stopped:
                self._last_action = self._clock()
                self._streak = (Hold, 0)
            return result

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Run a round every `interval` seconds until `stop` is set; a failed round is logged."""
        while not stop.is_set():
            try:
                result = await self.run_once()
                for subject, why in result.skipped:
                    log.debug("autoscaler skipped %s: %s", subject, why)
            except Exception:
                log.exception("autoscaling round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def _scale_out(self, snapshot: FleetSnapshot, decision: ScaleOut) -> AutoscaleRound:
        have = len(snapshot.alive_hosts()) + snapshot.hosts_pending
        wanted = decision.hosts
        skipped: list[tuple[str, str]] = []
        if self.max_hosts:
            room = max(0, self.max_hosts - have)
            if room < wanted:
                skipped.append(("scale-out", f"{wanted - room} host(s) over max_hosts"))
            wanted = min(wanted, room)
        outcomes = await asyncio.gather(
            *(self._start_host(kind) for kind in self._kinds_to_add(snapshot, wanted)),
            return_exceptions=True,
        )
        started = []
        for outcome in outcomes:
            if isinstance(outcome, FleetError):
                log.warning("could not add a host: %s", outcome.message)
                skipped.append(("scale-out", outcome.message))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                started.append(outcome)
        if started:
            log.info("scaled out: started %s", ", ".join(started))
            if self._metrics is not None:
                self._metrics.hosts_added.inc(len(started))
        return AutoscaleRound(decision, started=tuple(started), skipped=tuple(skipped))

    def _kinds_to_add(self, snapshot: FleetSnapshot, count: int) -> list[str | None]:
        """The kind of each of `count` hosts to add (None: the provider's own)."""
        if self.spot_share <= 0:
            return [None] * count
        alive = snapshot.alive_hosts()
        known = {host.id for host in alive}
        spot = sum(1 for host in alive if host.kind == SPOT)
        spot += sum(
            1
            for host_id in self.provider.hosts()
            if host_id not in known and self._kinds.get(host_id) == SPOT
        )
        fleet = len(alive) + snapshot.hosts_pending
        kinds: list[str | None] = []
        for _ in range(count):
            kind = kind_to_add(spot, fleet, self.spot_share)
            kinds.append(kind)
            fleet += 1
            spot += kind == SPOT
        return kinds

    async def _start_host(self, kind: str | None) -> str:
        started = self._clock()
        host_id = await self.provider.start_host(kind)
        if kind is not None:
            self._kinds[host_id] = kind
        if self._metrics is not None:
            self._metrics.scale_out_time.observe(self._clock() - started)
        return host_id

    async def _scale_in(self, snapshot: FleetSnapshot, decision: ScaleIn) -> AutoscaleRound:
        alive = len(snapshot.alive_hosts())
        stopped: list[str] = []
        skipped: list[tuple[str, str]] = []
        for host_id in self._removable(snapshot, decision.host_ids):
            if alive - len(stopped) <= self.min_hosts:
                skipped.append((host_id, f"the fleet is at min_hosts ({self.min_hosts})"))
                continue
            why = await self._release(snapshot, host_id)
            if why:
                skipped.append((host_id, why))
                continue
            stopped.append(host_id)
        if stopped:
            log.info("scaled in: stopped %s", ", ".join(stopped))
            if self._metrics is not None:
                self._metrics.hosts_removed.inc(len(stopped))
        return AutoscaleRound(decision, stopped=tuple(stopped), skipped=tuple(skipped))

    def _removable(self, snapshot: FleetSnapshot, chosen: tuple[str, ...]) -> list[str]:
        """The policy's choice, with each host the provider did not start swapped for the
        provider's idle host with the fewest replicas (then by id) that was not chosen."""
        ours = set(self.provider.hosts())
        spares = sorted(
            (
                host
                for host in snapshot.alive_hosts()
                if host.id in ours and host.id not in chosen and host.gpus_committed == 0
            ),
            key=lambda host: (host.replicas, host.id),
        )
        result = []
        for host_id in chosen:
            if host_id not in ours and spares:
                host_id = spares.pop(0).id
            result.append(host_id)
        return result

    async def _release(self, snapshot: FleetSnapshot, host_id: str) -> str:
        """Drain and stop one host; the reason it was left running, or "" once it is stopped."""
        if host_id not in self.provider.hosts():
            return "not started by this autoscaler's provider"
        host = snapshot.host(host_id)
        if host is not None and host.gpus_committed > 0:
            return f"{host.gpus_committed} GPU(s) committed"
        try:
            await self._drain(host_id)  # even with no replica: it closes the host to new ones
        except FleetError as e:
            return f"draining failed: {e.message}"
        after = self.snapshot().host(host_id)
        if after is not None and (after.replicas > 0 or after.gpus_committed > 0):
            return f"still holds {after.replicas} replica(s) after draining"
        self._hosts.stopping(host_id)
        try:
            await self.provider.stop_host(host_id)
        except FleetError as e:
            log.error("host %s was drained but could not be stopped: %s", host_id, e.message)
            return f"stopping failed: {e.message}"
        self._hosts.forget(host_id)
        return ""


def _describe(decision: AutoscaleDecision) -> str:
    if isinstance(decision, ScaleOut):
        return f"add {decision.hosts} host(s)"
    if isinstance(decision, ScaleIn):
        return f"remove {', '.join(decision.host_ids)}"
    return "hold"
