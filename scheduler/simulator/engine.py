"""The discrete-event engine: replays a trace's sessions through one policy.

The engine owns the clock and executes the policy's decisions on the simulated `Cluster`; the
policy only sees frozen snapshots. Per session: its kernel is admitted ``session_lead_s`` before
its first event; each event is a cell submitted when the trace says, shifted by the delays the
session met so far (the trace's idle gap after the previous cell is kept); the session ends
``session_linger_s`` after its last cell. Requests a policy queues wait in arrival order and are
asked about again, oldest first, whenever capacity changes. A cell may not take GPUs on a host
where an older waiting cell could run (one of its kernel's replica hosts; any host for a kernel
without replicas): free GPUs there are kept for the elder, so a large cell is not starved by a
stream of small ones. That rule is `kernelfleet.scheduler.waiting.held_for_elders`, the code the
gateway runs (`kernelfleet.gateway.executors`).

Host kinds (docs/economics.md, "Transient hosts"): scale-out adds spot hosts within the
config's ``spot_share`` (`hostkinds.kind_to_add`), each revoked after a time drawn from the
revocation process (seeded). A revocation cuts the cells running on the host (run again
elsewhere, their GPU-hours counted as redone) and replaces its replicas on other hosts, which
takes ``migration_cost_s`` from the notice; a kernel whose live replicas, the revoked one and
those still being replaced aside, are no longer a majority is counted as lost.
"""

from __future__ import annotations

import enum
import heapq
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.decisions import (
    Migrate,
    Placement,
    Reject,
    RunOn,
    ScaleIn,
    ScaleOut,
)
from kernelfleet.scheduler.demand_model import DemandModel, Forecaster
from kernelfleet.scheduler.hostkinds import (
    SPOT,
    kind_to_add,
    spot_hosts_barred,
    spot_replicas_allowed,
)
from kernelfleet.scheduler.policies import AutoscalingPolicy, migration_target
from kernelfleet.scheduler.policy import (
    ExecuteRequest,
    GpuBinding,
    PlacementRequest,
    Policy,
    StateSync,
)
from kernelfleet.scheduler.simulator.cluster import Cluster, LedgerError, SimKernel
from kernelfleet.scheduler.simulator.config import SimulationConfig, policy_assumptions
from kernelfleet.scheduler.simulator.metrics import Gauge, PolicyResult
from kernelfleet.scheduler.simulator.sessions import SessionState, SimSession
from kernelfleet.scheduler.snapshot import NO_ARRIVALS, FleetSnapshot
from kernelfleet.scheduler.trace import Trace
from kernelfleet.scheduler.usage import UsageWindow
from kernelfleet.scheduler.waiting import held_for_elders

log = logging.getLogger("kernelfleet.scheduler.simulator")

Progress = Callable[[float], None]


class Event(enum.IntEnum):
    """Kinds of events; at equal times lower values go first (capacity before demand)."""

    HOST_READY = 0
    CELL_END = 1
    KERNEL_RECLAIM = 2
    SESSION_END = 3
    SESSION_START = 4
    CELL_SUBMIT = 5
    TICK = 6
    HOST_REVOKED = 7


@dataclass
class _Waiting:
    """A queued request: a kernel admission (cell = -1) or a cell submitted at `since`. A cell
    is a `WaitingCell` for the waiting-order rule, read from its kernel as it is now."""

    session: SimSession
    cell: int
    since: float

    @property
    def gpus(self) -> int:
        return self.session.kernel.gpus

    @property
    def hosts(self) -> list[str] | None:
        """Its kernel's replica hosts; None (any host) for a kernel without replicas."""
        return self.session.kernel.replica_hosts or None


class Simulation:
    """One policy over one trace. `run` once; it returns the `PolicyResult`. With a
    `demand_model`, an autoscaling policy is given its prediction (`Forecaster`, fed with the
    simulated cells' submits and ends, busy GPUs and kernels alive) in every snapshot."""

    def __init__(
        self,
        policy: Policy,
        trace: Trace,
        config: SimulationConfig,
        progress: Progress | None = None,
        demand_model: DemandModel | None = None,
    ) -> None:
        self.policy = policy
        self.config = config
        self.market = config.market()
        if config.spot_replicas_override is not None:  # the config's looser rule, if any
            policy.max_spot_replicas = config.spot_replicas_override
        self._spot_allowed = spot_replicas_allowed(policy.replicas, policy.max_spot_replicas)
        self._revocations = random.Random(config.revocation_seed)
        self.progress = progress
        self.cluster = Cluster(config.gpus_per_host)
        self.result = PolicyResult(
            policy.name, policy_assumptions(policy), sessions=len(trace.sessions)
        )
        self.sessions = [SimSession(s, SimKernel(f"k{s.id}", s.gpus)) for s in trace.sessions]
        self.now = min((s.start_min * 60 for s in trace.sessions), default=0.0)
        self.now -= config.session_lead_s
        self.provisioned = Gauge(self.now)
        self.committed = Gauge(self.now)
        self.busy = Gauge(self.now)
        self.provisioned_spot = Gauge(self.now)
        self._running: dict[int, tuple[int, str, float, float]] = {}
        """Cells running, by session: (cell index, host, start, end)."""
        self._reruns: set[tuple[int, int]] = set()
        """(session, cell) of cells cut by a revocation, whose start delay was counted."""
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._waiting: list[_Waiting] = []
        self._remaining = len(self.sessions)
        self._window = UsageWindow.spanning(config.ratio_window_s, config.autoscale_interval_s)
        self._ratio_inputs = (0.0, 0.0)
        self._arrivals = ArrivalWindow(config.arrival_window_s)
        self._quiet_version = -1
        # a rule that reads the clock (idle times, host ages, the arrival rate) may change its
        # answer on a fleet that did not change, so it is asked every round
        scaling = policy.autoscaling if isinstance(policy, AutoscalingPolicy) else None
        self._rule_reads_clock = scaling is not None and bool(
            scaling.scale_in_idle_s or scaling.min_host_lifetime_s or scaling.warm_quantile
        )
        self._counts_arrivals = scaling is not None and scaling.warm_quantile > 0
        self._forecaster = (
            Forecaster(demand_model) if scaling is not None and demand_model is not None else None
        )
        self._rule_reads_clock = self._rule_reads_clock or self._forecaster is not None

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> PolicyResult:
        self.cluster.now = self.now
        for _ in range(self.config.hosts):
            self.cluster.add_host()
        self._set_gauges()
        for session in self.sessions:
            session.next_submit = session.trace.start_min * 60
            start = session.next_submit - self.config.session_lead_s
            self._at(start, Event.SESSION_START, session.trace.id)
        self._at(self.now, Event.TICK)
        handled = 0
        while self._heap and self._remaining > 0:
            time, kind, _, a, b = heapq.heappop(self._heap)
            self.now = self.cluster.now = time
            self._handle(Event(kind), a, b)
            self._set_gauges()
            handled += 1
            if self.progress is not None and handled % 20_000 == 0:
                self.progress(1 - self._remaining / max(1, len(self.sessions)))
        return self._finish()

    def _handle(self, kind: Event, a: int, b: int) -> None:
        if kind is Event.HOST_READY:
            self._host_ready(spot=bool(a))
        elif kind is Event.HOST_REVOKED:
            self._revoke(f"h{a}")
        elif kind is Event.CELL_END:
            if self._running.get(a, (None,))[0] == b and self._running[a][3] == self.now:
                self._cell_end(self.sessions[a], b)  # else a cell cut by a revocation
        elif kind is Event.KERNEL_RECLAIM:
            self._release_kernel(self.sessions[a], SessionState.RECLAIMED)
        elif kind is Event.SESSION_END:
            self._release_kernel(self.sessions[a], SessionState.ENDED)
        elif kind is Event.SESSION_START:
            session = self.sessions[a]
            session.move(SessionState.ADMITTING)
            if not self._try_admit(session):
                self._waiting.append(_Waiting(session, -1, self.now))
        elif kind is Event.CELL_SUBMIT:
            self._cell_submit(self.sessions[a], b)
        else:
            self._tick()

    def _at(self, time: float, kind: Event, a: int = 0, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, kind.value, self._seq, a, b))

    # ---- sessions ------------------------------------------------------------------------

    def _try_admit(self, session: SimSession) -> bool:
        """Ask the policy to place the session's kernel; True when no longer waiting."""
        kernel = session.kernel
        request = PlacementRequest(kernel.id, replicas=self.policy.replicas, gpus=kernel.gpus)
        decision = self.policy.admit(self._snapshot(), request)
        if isinstance(decision, Placement):
            self.cluster.add_kernel(kernel, decision.host_ids)
            if self.policy.binding is GpuBinding.PER_SESSION and decision.host_ids:
                kernel.reserved_host = kernel.executor_host = decision.host_ids[0]
                self.cluster.commit(kernel.reserved_host, kernel.gpus)
            session.move(SessionState.ACTIVE)
            submit = max(self.now, session.next_submit)
            self._at(submit, Event.CELL_SUBMIT, session.trace.id, session.next_cell)
            return True
        if isinstance(decision, Reject):
            log.debug("session %d rejected: %s", session.trace.id, decision.detail)
            self.result.rejected_sessions += 1
            self.result.rejected_events += len(session.trace.events) - session.next_cell
            for event in session.trace.events[session.next_cell :]:
                self.result.note_rejection(event.line, decision.reason.value, decision.detail)
            session.move(SessionState.ENDED)
            self._remaining -= 1
            return True
        if isinstance(decision, ScaleOut):
            self._provision(decision.hosts, decision.kind)
        return False

    def _release_kernel(self, session: SimSession, to: SessionState) -> None:
        """The session's kernel goes away: idle reclamation (RECLAIMED) or the end (ENDED)."""
        kernel = session.kernel
        if kernel.reserved_host is not None:
            self.cluster.release(kernel.reserved_host, kernel.gpus)
            kernel.reserved_host = None
        self.cluster.remove_kernel(kernel.id)
        kernel.executor_host = None
        session.move(to)
        if to is SessionState.ENDED:
            self._remaining -= 1
        self._retry_waiting()

    # ---- cells ---------------------------------------------------------------------------

    def _cell_submit(self, session: SimSession, index: int) -> None:
        """A cell arrives; it counts from its intended submit time even when the kernel's
        admission made it late."""
        since = min(self.now, session.next_submit)
        if self._counts_arrivals:
            self._arrivals.add(self.now, session.kernel.gpus)
        if self._forecaster is not None:
            self._forecaster.arrival(self.now, session.kernel.gpus)
        if not self._try_cell(session, index, since, self._waiting):
            self._waiting.append(_Waiting(session, index, since))

    def _try_cell(
        self, session: SimSession, index: int, since: float, elders: list[_Waiting]
    ) -> bool:
        """Ask the policy where the cell runs; True when it started or was rejected. A host
        that one of `elders` (the requests waiting longer) could run on is kept for it. A
        migration is made before that check, as the gateway does; a cell that then waits
        pays no migration cost when it runs (the move overlapped its wait)."""
        kernel = session.kernel
        request = ExecuteRequest(kernel.snapshot(self.now), kernel.gpus)
        decision = self.policy.choose_executor(self._snapshot(), request)
        if isinstance(decision, RunOn):
            if self._held_for(elders, decision.host_id, kernel.gpus):
                return False
            self._start_cell(session, index, since, decision.host_id, 0.0)
            return True
        if isinstance(decision, Migrate):
            self.cluster.move_replica(kernel, decision.from_host, decision.to_host)
            self.result.migrations += 1
            self.result.migrations_for_cells += 1
            if self._held_for(elders, decision.to_host, kernel.gpus):
                return False
            cost = self.config.migration_cost_s
            self._start_cell(session, index, since, decision.to_host, cost)
            return True
        if isinstance(decision, Reject):
            log.debug("cell %d of session %d rejected", index, session.trace.id)
            self.result.rejected_events += 1
            line = session.trace.events[index].line
            self.result.note_rejection(line, decision.reason.value, decision.detail)
            self._next_cell(session, index, self.now)
            return True
        if isinstance(decision, ScaleOut):
            self._provision(decision.hosts, decision.kind)
        return False

    def _held_for(self, elders: list[_Waiting], host_id: str, gpus: int) -> bool:
        """Whether the free GPUs a cell needing `gpus` would take on `host_id` are kept for a
        waiting cell among `elders` (`held_for_elders`; admissions are not cells). A cell
        takes free GPUs only under per-cell binding, as `_start_cell` commits them; under
        per-session binding it runs on GPUs its kernel already holds."""
        taking = gpus if self.policy.binding is GpuBinding.PER_CELL else 0
        return held_for_elders(host_id, taking, (item for item in elders if item.cell >= 0))

    def _start_cell(
        self, session: SimSession, index: int, since: float, host_id: str, extra: float
    ) -> None:
        kernel = session.kernel
        event = session.trace.events[index]
        if self.policy.binding is GpuBinding.PER_CELL:
            self.cluster.commit(host_id, kernel.gpus)
        kernel.executor_host = host_id
        after = 0.0
        if self.policy.state_sync is StateSync.ON_CRITICAL_PATH:
            extra += self.config.container_start_s + self.config.state_load_s
            after = self.config.state_save_s
        start = self.now + extra
        if (session.trace.id, index) in self._reruns:
            self._reruns.discard((session.trace.id, index))
        else:
            self.result.delays_s.append(start - since)
            self.result.events += 1
        self.busy.set(self.now, self.busy.value + kernel.gpus)
        end = start + event.duration_min * 60 + after
        self._running[session.trace.id] = (index, host_id, start, end)
        self._at(end, Event.CELL_END, session.trace.id, index)

    def _cell_end(self, session: SimSession, index: int) -> None:
        self._running.pop(session.trace.id, None)
        kernel = session.kernel
        if self.policy.binding is GpuBinding.PER_CELL and kernel.executor_host is not None:
            self.cluster.release(kernel.executor_host, kernel.gpus)
        self.busy.set(self.now, self.busy.value - kernel.gpus)
        if self._forecaster is not None:
            self._forecaster.end(self.now, kernel.gpus)
        self._next_cell(session, index, self.now)
        self._retry_waiting()

    def _next_cell(self, session: SimSession, index: int, ended: float) -> None:
        """Schedule what follows cell `index`: the next cell after the trace's idle gap (with
        the kernel reclaimed in between when the gap outlasts the idle timeout), or the end."""
        events = session.trace.events
        sid = session.trace.id
        if index + 1 < len(events):
            gap = max(0.0, (events[index + 1].submit_min - events[index].end_min) * 60)
            session.next_cell, session.next_submit = index + 1, ended + gap
            timeout, lead = self.config.idle_timeout_s, self.config.session_lead_s
            if timeout > 0 and gap > timeout + lead:
                self._at(ended + timeout, Event.KERNEL_RECLAIM, sid)
                self._at(session.next_submit - lead, Event.SESSION_START, sid)
            else:
                self._at(session.next_submit, Event.CELL_SUBMIT, sid, index + 1)
        else:
            self._at(ended + self.config.session_linger_s, Event.SESSION_END, session.trace.id)

    # ---- capacity ------------------------------------------------------------------------

    def _retry_waiting(self) -> None:
        """Ask again about every queued request, oldest first; a cell's elders are the older
        requests still waiting."""
        if not self._waiting:
            return
        still: list[_Waiting] = []
        for item in self._waiting:
            if item.cell < 0:
                done = self._try_admit(item.session)
            else:
                done = self._try_cell(item.session, item.cell, item.since, still)
            if not done:
                still.append(item)
        self._waiting = still

    def _provision(self, hosts: int, kind: str | None = None) -> None:
        """Ask for `hosts` hosts of `kind`; None: `kind_to_add` decides, for a policy whose
        kernels may have a replica on spot (never for one that keeps a single replica)."""
        limit = self.config.max_hosts
        cluster = self.cluster
        share = self.market.spot_share
        if self.policy.replicas > 0 and self._spot_allowed == 0:
            share = 0.0
        for _ in range(hosts):
            if limit and len(cluster.hosts) + cluster.pending >= limit:
                return
            fleet = len(cluster.hosts) + cluster.pending
            spot = kind or kind_to_add(cluster.spot_hosts + cluster.pending_spot, fleet, share)
            delay = self.config.scale_out_delay_s
            if spot == SPOT:
                cluster.pending_spot += 1
                delay += self.market.spot_extra_start_s
            cluster.pending += 1
            self.result.scale_outs += 1
            self._at(self.now + delay, Event.HOST_READY, int(spot == SPOT))

    def _host_ready(self, spot: bool) -> None:
        """A host asked for is up; a spot host's revocation is drawn now."""
        self.cluster.pending -= 1
        self.cluster.pending_spot -= spot
        host = self.cluster.add_host(SPOT if spot else "on-demand")
        rate = self.market.revocation_rate_per_hour
        if spot and rate > 0:
            lifetime = self._revocations.expovariate(rate / 3600)
            self._at(self.now + lifetime, Event.HOST_REVOKED, int(host.id[1:]))
        self._retry_waiting()

    # ---- revocations ---------------------------------------------------------------------

    def _revoke(self, host_id: str) -> None:
        """Spot host `host_id` is revoked now (unless scale-in released it before): its cells
        are cut and run again, its replicas replaced; see the module docstring."""
        host = self.cluster.hosts.get(host_id)
        if host is None:
            return
        self.result.revocations += 1
        cut = {sid: cell[0] for sid, cell in self._running.items() if cell[1] == host_id}
        for sid in cut:
            self._cut(sid)
        for kernel_id in sorted(host.kernels):
            self._replace(self.cluster.kernels[kernel_id], host_id)
        self.cluster.remove_host(host_id)
        for sid, index in cut.items():
            self._waiting.append(_Waiting(self.sessions[sid], index, self.now))
        self._retry_waiting()

    def _cut(self, sid: int) -> None:
        """The cell running for session `sid` is cut: its GPUs are released and its work so
        far is counted as redone; it is run again (its start delay is not counted twice)."""
        index, host_id, start, _ = self._running.pop(sid)
        kernel = self.sessions[sid].kernel
        if self.policy.binding is GpuBinding.PER_CELL:
            self.cluster.release(host_id, kernel.gpus)
        self.busy.set(self.now, self.busy.value - kernel.gpus)
        self.result.cells_interrupted += 1
        self.result.gpu_hours_redone += kernel.gpus * max(0.0, self.now - start) / 3600
        self._reruns.add((sid, index))

    def _replace(self, kernel: SimKernel, host_id: str) -> None:
        """Replace `kernel`'s replica on revoked `host_id` on another host (within the spot
        limit), counting the kernel lost if its live replicas are no longer a majority. The
        replacement starts at the notice and takes ``migration_cost_s``. A kernel left with
        no replica at all (every replacement of its replicas found no host) starts again."""
        now = self.now
        kernel.replacing = {h: until for h, until in kernel.replacing.items() if until > now}
        kernel.replacing.pop(host_id, None)
        live = [h for h in kernel.replica_hosts if h != host_id and h not in kernel.replacing]
        if len(live) < self.policy.replicas // 2 + 1:
            self.result.kernels_lost += 1
        gpus = 0
        if kernel.reserved_host == host_id:
            self.cluster.release(host_id, kernel.gpus)
            kernel.reserved_host = None
            gpus = kernel.gpus
        snapshot = self._snapshot()
        barred = spot_hosts_barred(
            snapshot,
            kernel.replica_hosts,
            host_id,
            self._spot_allowed,
            kernel.catching_up(now),
            self.policy.replicas,
        )
        target = migration_target(snapshot, gpus, {*kernel.replica_hosts, *barred})
        if target is None:
            self.cluster.remove_replica(kernel, host_id)
            self.result.replacements_failed += 1
        else:
            self.cluster.move_replica(kernel, host_id, target.id)
            self.result.replacements += 1
            ready = now - self.market.notice_s + self.config.migration_cost_s
            if ready > now:
                kernel.replacing[target.id] = ready
            if gpus:
                self.cluster.commit(target.id, gpus)
                kernel.reserved_host = kernel.executor_host = target.id
        if not kernel.replica_hosts:
            self._restart(kernel)

    def _restart(self, kernel: SimKernel) -> None:
        """`kernel` has no replica left (every replacement found no host): it is placed
        again at once, its state lost; where the policy finds no place now (it asks for hosts)
        it stays without replicas, and its cells until it has some are rejected (counted)."""
        kernel.executor_host = None
        request = PlacementRequest(kernel.id, replicas=self.policy.replicas, gpus=kernel.gpus)
        decision = self.policy.admit(self._snapshot(), request)
        if isinstance(decision, Placement):
            for host_id in decision.host_ids:
                self.cluster.add_replica(kernel, host_id)
            if self.policy.binding is GpuBinding.PER_SESSION and decision.host_ids:
                kernel.reserved_host = kernel.executor_host = decision.host_ids[0]
                self.cluster.commit(kernel.reserved_host, kernel.gpus)
        elif isinstance(decision, ScaleOut):
            self._provision(decision.hosts, decision.kind)

    def _tick(self) -> None:
        subscribed = sum(host.subscribed for host in self.cluster.hosts.values())
        self._window.add(float(subscribed), self.busy.value)
        self._ratio_inputs = (self._window.demand, self._window.busy)
        if self._forecaster is not None:
            self._forecaster.observe(self.now, self.busy.value, len(self.cluster.kernels))
        if self._rule_reads_clock or self.cluster.version != self._quiet_version or self._waiting:
            decision = self.policy.autoscale(self._snapshot())
            if isinstance(decision, ScaleOut):
                self._provision(decision.hosts, decision.kind)
            elif isinstance(decision, ScaleIn):
                self._scale_in(decision.host_ids)
            else:
                self._quiet_version = self.cluster.version
        self._at(self.now + self.config.autoscale_interval_s, Event.TICK)

    def _scale_in(self, host_ids: tuple[str, ...]) -> None:
        """Release each idle host after moving its replicas to the least loaded other host."""
        for host_id in host_ids:
            host = self.cluster.hosts.get(host_id)
            if host is None or host.committed:
                continue
            for kernel_id in sorted(host.kernels):
                kernel = self.cluster.kernels[kernel_id]
                snapshot = self._snapshot()
                barred = spot_hosts_barred(
                    snapshot,
                    kernel.replica_hosts,
                    host_id,
                    self._spot_allowed,
                    kernel.catching_up(self.now),
                    self.policy.replicas,
                )
                exclude = {*kernel.replica_hosts, *host_ids, *barred}
                target = migration_target(snapshot, 0, exclude)
                if target is None:
                    break
                self.cluster.move_replica(kernel, host_id, target.id)
                self.result.migrations += 1
            if not host.kernels:
                self.cluster.remove_host(host_id)
                self.result.scale_ins += 1

    # ---- measuring -----------------------------------------------------------------------

    def _snapshot(self) -> FleetSnapshot:
        waiting = sum(item.session.kernel.gpus for item in self._waiting)
        demand, busy = self._ratio_inputs
        arrivals = self._arrivals.stats(self.now) if self._counts_arrivals else NO_ARRIVALS
        forecaster = self._forecaster
        predicted = None if forecaster is None else forecaster.predicted_gpus()
        return self.cluster.snapshot(self.now, demand, busy, waiting, arrivals, predicted)

    def _set_gauges(self) -> None:
        alive = len(self.cluster.hosts)
        self.result.peak_hosts = max(self.result.peak_hosts, alive)
        self.provisioned.set(self.now, alive * self.config.gpus_per_host)
        self.provisioned_spot.set(self.now, self.cluster.spot_hosts * self.config.gpus_per_host)
        self.committed.set(self.now, self.cluster.committed)

    def _finish(self) -> PolicyResult:
        result = self.result
        if self._remaining == 0 and (self.cluster.committed or self.cluster.kernels):
            raise LedgerError(
                f"{result.policy}: {self.cluster.committed} GPU(s) and "
                f"{len(self.cluster.kernels)} kernel(s) left after every session ended"
            )
        for gauge in (self.provisioned, self.committed, self.busy, self.provisioned_spot):
            gauge.close(self.now)
        result.end_s = self.now
        result.gpu_hours_provisioned = self.provisioned.area / 3600
        result.gpu_hours_committed = self.committed.area / 3600
        result.gpu_hours_busy = self.busy.area / 3600
        result.gpu_hours_spot = self.provisioned_spot.area / 3600
        on_demand = result.gpu_hours_provisioned - result.gpu_hours_spot
        market = self.market
        result.dollars = (
            on_demand * market.on_demand_price + result.gpu_hours_spot * market.spot_price
        )
        result.dollars_on_demand = result.gpu_hours_provisioned * market.on_demand_price
        result.provisioned_history = self.provisioned.history
        result.busy_history = self.busy.history
        result.committed_history = self.committed.history
        if self._waiting:
            log.warning(
                "%s: %d request(s) still waiting at the end", result.policy, len(self._waiting)
            )
        return result
