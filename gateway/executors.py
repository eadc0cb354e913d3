"""Where each cell runs and which GPUs it holds while it runs.

`ExecutorChooser.assign` is the `CellQueue`'s `Assign` for every kernel: it asks the policy
(`Policy.choose_executor`) over a snapshot built from the `GpuLedger`, and carries out the
answer:

- `RunOn`: commit the cell's GPUs on that replica's host, exclusively, until the cell ends;
- `Migrate`: move the replica (add-first, state kept), then ask again; a kernel with a
  single replica cannot move without losing its state, so its cell waits instead;
- `Queue` / `ScaleOut`: wait until GPUs are released or hosts change, showing the user why
  ("waiting for 2 GPUs — 1 cell ahead of you"), then ask again; an interrupt cancels the wait;
- `Reject`: fail the cell at once with the policy's reason.

Devices committed to a cell are released when it ends, however it ends. Under a policy that
binds GPUs per session (`reservation`), the kernel's GPUs are committed when it starts (or by
its first cell, after its replica was replaced) and held until it goes. A replica whose
memory may still sit on devices now committed to another cell is asked to move it off first
(`kernelfleet.protocol.Request.RELEASE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from kernelfleet.errors import FleetError, GpusUnavailable, KernelDead, NoCapacity
from kernelfleet.gateway.cells import Assignment, Cell
from kernelfleet.gateway.demand import LiveDemand
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus, publish_binding
from kernelfleet.gateway.ledger import Commitment, GpuLedger
from kernelfleet.gateway.ledger_records import Binding
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord, ReplicaState
from kernelfleet.scheduler import FleetSnapshot, GpuBinding, Policy
from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.decisions import Migrate, Reject, RunOn, ScaleOut
from kernelfleet.scheduler.policy import ExecuteRequest
from kernelfleet.scheduler.snapshot import KernelSnapshot
from kernelfleet.scheduler.waiting import held_for_elders

log = logging.getLogger("kernelfleet.gateway.executors")

SESSION = "session"
"""The ledger's cell id for GPUs bound for a kernel's whole life (`GpuBinding.PER_SESSION`)."""

RECHECK_INTERVAL = 2.0
"""Seconds between re-asking the policy while a cell waits, even if nothing was released."""


class KernelOps(Protocol):
    """What the chooser needs from the kernel service."""

    def snapshot(self, kernel: KernelRecord | None = None) -> FleetSnapshot: ...
    async def move_replica(
        self, kernel: KernelRecord, replica: ReplicaRecord, host: str
    ) -> None: ...
    async def release_memory(self, kernel_id: str, replica_id: str) -> None: ...


class JobPreemption(Protocol):
    """What the chooser needs from the jobs service (`kernelfleet.gateway.jobs`): cells first."""

    async def preempt(self, job_ids: tuple[str, ...], why: str) -> None:
        """Stop those jobs (SIGTERM, grace, SIGKILL) and requeue them; returns once their
        processes exited, so the devices a cell took from them are free."""

    def gpus_released(self) -> None:
        """Cells released GPUs: waiting jobs may have them (soon, not at once)."""


@dataclass(eq=False)
class _Waiter:
    """A cell waiting for GPUs: what it needs, where it could run (its live replicas' hosts,
    as of its last ask), and its wake-up call; a `WaitingCell` for the waiting-order rule."""

    cell: Cell
    kernel_id: str
    gpus: int
    hosts: frozenset[str]
    turn: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    since: float = field(default_factory=time.monotonic)
    told: tuple[str, int] | None = None
    """(why, cells ahead) as last published in a ``cell-waiting`` event."""


class ExecutorChooser:
    """Assigns every kernel's cells; see the module docstring.

    Waiting cells are served in arrival order: when GPUs are released they ask the policy
    again oldest first, and a newer cell may not take GPUs on a host an older waiting cell
    could run on (so a cell needing 2 GPUs is not starved by a stream of 1-GPU cells): the
    rule of `kernelfleet.scheduler.waiting`, which the simulator runs too.
    """

    def __init__(
        self,
        policy: Policy,
        ledger: GpuLedger,
        kernels: KernelOps,
        metrics: FleetMetrics,
        events: EventBus | None = None,
    ) -> None:
        self._policy = policy
        self._ledger = ledger
        self._kernels = kernels
        self._metrics = metrics
        self._events = events or EventBus()
        self._waiting: list[_Waiter] = []
        """Cells waiting for GPUs, in arrival order (what "ahead of you" counts)."""
        self._jobs: JobPreemption | None = None
        self._preempting: set[asyncio.Task[None]] = set()
        self.demand: LiveDemand | None = None
        """Told of every cell submitted and every cell's GPUs released (the demand model's
        live inputs), when the autoscaler has a demand model."""
        self.arrivals: ArrivalWindow | None = None
        """Told of every cell submitted and its GPUs (on `time.monotonic`), when the
        autoscaler keeps warm capacity for the cells to come."""
        self._stopping: set[str] = set()
        """Kernels shut down whose replicas are still stopping: their cells' GPUs stay bound."""

    def hold_until_stopped(self, kernel_id: str) -> None:
        """Kernel `kernel_id` was shut down: a cell of it that ends now (its link closed) keeps
        its GPUs, which its process may still use, until `stopped` (the ledger's
        ``unsubscribe``/``remove_kernel`` then gives them back)."""
        self._stopping.add(kernel_id)

    def stopped(self, kernel_id: str) -> None:
        """The replicas of kernel `kernel_id` are gone (see `hold_until_stopped`)."""
        self._stopping.discard(kernel_id)

    def preempt_jobs_with(self, jobs: JobPreemption) -> None:
        """From now on, a cell that takes devices lent to background jobs has `jobs` stop them
        before it starts."""
        self._jobs = jobs

    def capacity_changed(self) -> None:
        """GPUs were released or hosts changed: waiting cells ask the policy again, oldest
        first (futures resolved in this order wake their tasks in this order); then the jobs
        service, which lends what the cells left."""
        for waiter in self._waiting:
            if not waiter.turn.done():
                waiter.turn.set_result(None)
        if self._jobs is not None:
            self._jobs.gpus_released()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def waiting_gpus(self) -> int:
        """The GPUs the waiting cells ask for, together (the autoscaler's unmet demand)."""
        return sum(waiter.gpus for waiter in self._waiting)

    @property
    def per_session(self) -> bool:
        """Whether the policy binds GPUs for a kernel's whole life (`reservation`)."""
        return self._policy.binding is GpuBinding.PER_SESSION

    def reserve(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        """Commit the kernel's GPUs on `replica`'s host until the kernel (or the replica) goes:
        what a per-session policy does when a kernel starts. `GpusUnavailable` if taken."""
        commitment = self._ledger.commit(
            replica.host_id, kernel.id, replica.id, SESSION, kernel.gpus
        )
        self._committed(commitment)
        if commitment.preempted and self._jobs is not None:  # its first cell cannot wait here
            stopping = asyncio.get_running_loop().create_task(
                self._jobs.preempt(commitment.preempted, f"kernel {kernel.id} reserved its GPUs")
            )
            self._preempting.add(stopping)
            stopping.add_done_callback(self._preempting.discard)

    async def assign(self, kernel: KernelRecord, cell: Cell) -> Assignment:
        """Choose the replica and GPUs of `cell`; waits while the policy says to wait."""
        gpus = kernel.gpus if cell.gpus is None or self.per_session else cell.gpus
        if self.per_session and cell.gpus not in (None, kernel.gpus):
            raise NoCapacity(
                f"under the {self._policy.name} policy a cell runs on its kernel's "
                f"{_gpus(kernel.gpus)}, held for its whole life; it cannot ask for {cell.gpus}"
            )
        cell.gpus_used = gpus
        if self.demand is not None:
            self.demand.cell_submitted(gpus)
        if self.arrivals is not None:
            self.arrivals.add(time.monotonic(), gpus)
        waiter: _Waiter | None = None
        try:
            while True:
                replicas = self._candidates(kernel, cell)
                decision = self._policy.choose_executor(
                    self._kernels.snapshot(kernel), self._request(kernel, replicas, gpus)
                )
                if isinstance(decision, Reject):
                    raise NoCapacity(f"this cell {decision.reason.value} ({decision.detail})")
                if isinstance(decision, RunOn):
                    replica = next(r for r in replicas if r.host_id == decision.host_id)
                    assignment = await self._run_on(kernel, replica, cell, gpus, waiter)
                    if assignment is not None:
                        return assignment
                elif isinstance(decision, Migrate) and kernel.replicated:
                    source = next(r for r in replicas if r.host_id == decision.from_host)
                    cell.say(f"kernelfleet: {moving_text(decision.to_host, gpus)}")
                    await self._kernels.move_replica(kernel, source, decision.to_host)
                    cell.moved_to = decision.to_host
                    continue
                why = (
                    "hosts being added" if isinstance(decision, ScaleOut) else "GPUs to be released"
                )
                hosts = frozenset(r.host_id for r in replicas)
                if waiter is None:  # registered here, so that `finally` sees it if cancelled
                    waiter = _Waiter(cell, kernel.id, gpus, hosts)
                    self._waiting.append(waiter)
                    self._metrics.queued_cells.set(len(self._waiting))
                else:
                    waiter.hosts = hosts
                await self._wait_turn(waiter, why)
        finally:
            if waiter is not None and waiter in self._waiting:
                self._stop_waiting(waiter)
                self.capacity_changed()  # younger cells it held back may go now

    async def _run_on(
        self,
        kernel: KernelRecord,
        replica: ReplicaRecord,
        cell: Cell,
        gpus: int,
        waiter: _Waiter | None,
    ) -> Assignment | None:
        """The cell's GPUs on `replica`'s host: the kernel's own under a per-session policy,
        else committed now; None if they are taken, or kept for an older waiting cell."""
        cell.host_id = replica.host_id
        if self.per_session:
            held = self._ledger.binding(kernel.id, replica.id)
            if held is not None:  # nothing to commit or release
                return Assignment(replica.id, held.device_ids)
        if self._held_for_elders(replica.host_id, gpus, waiter):
            return None
        commitment = self._bind(kernel, replica, cell, gpus)
        if commitment is None:
            return None
        self._committed(commitment)
        if waiter is not None:
            self._stop_waiting(waiter)
            cell.waited = waited_text(time.monotonic() - waiter.since, gpus, cell.ahead or 0)
            cell.say(f"kernelfleet: {cell.waited}")
        if commitment.preempted and self._jobs is not None:
            await self._jobs.preempt(commitment.preempted, f"cell {cell.id} needs its GPUs")
        await self._displace(commitment)
        if self.per_session:  # held until the kernel goes
            return Assignment(replica.id, commitment.device_ids)
        return Assignment(
            replica.id, commitment.device_ids, lambda: self.release(kernel.id, cell.id)
        )

    async def _wait_turn(self, waiter: _Waiter, why: str) -> None:
        """Tell the user why the cell waits and how many cells are ahead, then wait until GPUs
        are released or hosts change (or `RECHECK_INTERVAL` passed)."""
        ahead = self._waiting.index(waiter)
        cell = waiter.cell
        text = waiting_text(waiter.gpus, why, ahead)
        cell.say(f"kernelfleet: {text}")
        if cell.ahead is None:
            cell.ahead = ahead
        if waiter.told != (why, ahead):
            waiter.told = (why, ahead)
            data = {"cell_id": cell.id, "gpus": waiter.gpus, "reason": why, "cells_ahead": ahead}
            cell.waiting_for = {**data, "text": text}
            self._events.publish(
                EventType.CELL_WAITING, cell.waiting_for, kernel_id=waiter.kernel_id
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.turn, RECHECK_INTERVAL)
        waiter.turn = asyncio.get_running_loop().create_future()

    def release(self, kernel_id: str, cell_id: str) -> None:
        """The cell ended: its devices are free (its replica's memory may stay, warm); not
        while its kernel's replicas are stopping (`hold_until_stopped`)."""
        if kernel_id in self._stopping:
            return
        released = self._ledger.release(kernel_id, cell_id=cell_id)
        if released:
            if self.demand is not None:
                self.demand.cell_ended(sum(len(binding.device_ids) for binding in released))
            self.released(released)
            self.capacity_changed()

    def released(self, bindings: tuple[Binding, ...]) -> None:
        """Publish a ``gpus-released`` event for each binding of devices just released."""
        publish_binding(self._events, EventType.GPUS_RELEASED, bindings)

    def _committed(self, commitment: Commitment) -> None:
        """Publish a ``gpus-committed`` event for devices just bound (none for zero GPUs)."""
        publish_binding(self._events, EventType.GPUS_COMMITTED, (commitment.binding,))

    def _held_for_elders(self, host_id: str, gpus: int, waiter: _Waiter | None) -> bool:
        """Whether the `gpus` this cell would commit on `host_id` are kept for a cell waiting
        longer than it (all of them, if this one does not wait yet): `held_for_elders`."""
        elders = self._waiting if waiter is None else self._waiting[: self._waiting.index(waiter)]
        return held_for_elders(host_id, gpus, elders)

    def _stop_waiting(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._metrics.queued_cells.set(len(self._waiting))

    def _candidates(self, kernel: KernelRecord, cell: Cell) -> list[ReplicaRecord]:
        link = kernel.link
        replicas = [
            r
            for r in kernel.replicas
            if link is not None and r.id in link.feeds and r.id not in cell.excluded
        ]
        if not replicas:
            tried = (
                f" ({', '.join(sorted(cell.excluded))} could not run it)" if cell.excluded else ""
            )
            raise KernelDead(f"kernel {kernel.id} has no live replica for this cell{tried}")
        return replicas

    @staticmethod
    def _request(kernel: KernelRecord, replicas: list[ReplicaRecord], gpus: int) -> ExecuteRequest:
        executor = next((r for r in replicas if r.id == kernel.executor), None)
        catching_up = (r.host_id for r in kernel.replicas if r.state is ReplicaState.CATCHING_UP)
        snapshot = KernelSnapshot(
            kernel.id,
            gpus,
            tuple(r.host_id for r in replicas),
            executor.host_id if executor else None,
            tuple(catching_up),
        )
        return ExecuteRequest(snapshot, gpus)

    def _bind(
        self, kernel: KernelRecord, replica: ReplicaRecord, cell: Cell, gpus: int
    ) -> Commitment | None:
        """Commit the GPUs; None if another cell took them first (the caller asks again)."""
        binding = SESSION if self.per_session else cell.id
        try:
            return self._ledger.commit(replica.host_id, kernel.id, replica.id, binding, gpus)
        except GpusUnavailable:
            return None

    async def _displace(self, commitment: Commitment) -> None:
        """Have replicas whose memory may be warm on the bound devices move it off first."""
        for other_kernel, other_replica in commitment.displaced:
            try:
                await self._kernels.release_memory(other_kernel, other_replica)
            except FleetError as e:
                log.warning("replica %s kept its GPU memory: %s", other_replica, e)
            self._ledger.mark_cold(other_kernel, other_replica)


def waiting_text(gpus: int, why: str, ahead: int) -> str:
    """What a cell waiting for GPUs shows (after ``kernelfleet: ``), and its event's text."""
    return f"waiting for {_gpus(gpus)} ({why}) — {_cells(ahead)} ahead of you"


def waited_text(seconds: float, gpus: int, ahead: int) -> str:
    """Why a cell started late: ``waited 13.1 s for 1 GPU (3 cells ahead)``; `ahead` counts
    the cells ahead of it when it began to wait."""
    return f"waited {seconds:.1f} s for {_gpus(gpus)}" + (
        f" ({_cells(ahead)} ahead)" if ahead else ""
    )


def moving_text(host: str, gpus: int) -> str:
    """What a cell shows while a replica of its kernel moves to `host` to run it."""
    return f"moving a replica to {host} to get {_gpus(gpus)}"


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def _cells(count: int) -> str:
    return f"{count} cell{'s' if count != 1 else ''}"
