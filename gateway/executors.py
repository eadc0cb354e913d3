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

Devices committed to a cell are released when it ends, however it ends. A replica whose
memory may still sit on devices now committed to another cell is asked to move it off first
(``kernelfleet_release_request``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from kernelfleet.errors import FleetError, GpusUnavailable, KernelDead, NoCapacity
from kernelfleet.gateway.cells import Assignment, Cell
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord
from kernelfleet.scheduler import FleetSnapshot, Policy
from kernelfleet.scheduler.decisions import Migrate, Reject, RunOn, ScaleOut
from kernelfleet.scheduler.policy import ExecuteRequest
from kernelfleet.scheduler.snapshot import KernelSnapshot

log = logging.getLogger("kernelfleet.gateway.executors")

RECHECK_INTERVAL = 2.0
"""Seconds between re-asking the policy while a cell waits, even if nothing was released."""


class KernelOps(Protocol):
    """What the chooser needs from the kernel service."""

    def snapshot(self) -> FleetSnapshot: ...
    async def move_replica(
        self, kernel: KernelRecord, replica: ReplicaRecord, host: str
    ) -> None: ...
    async def release_memory(self, kernel_id: str, replica_id: str) -> None: ...


class ExecutorChooser:
    def __init__(
        self, policy: Policy, ledger: GpuLedger, kernels: KernelOps, metrics: FleetMetrics
    ) -> None:
        self._policy = policy
        self._ledger = ledger
        self._kernels = kernels
        self._metrics = metrics
        self._changed = asyncio.Event()
        self._waiting: list[Cell] = []
        """Cells waiting for GPUs, in arrival order (what "ahead of you" counts)."""

    def capacity_changed(self) -> None:
        """GPUs were released or hosts changed: waiting cells ask the policy again."""
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def assign(self, kernel: KernelRecord, cell: Cell) -> Assignment:
        """Choose the replica and GPUs of `cell`; waits while the policy says to wait."""
        gpus = kernel.gpus if cell.gpus is None else cell.gpus
        waited_since: float | None = None
        try:
            while True:
                replicas = self._candidates(kernel, cell)
                decision = self._policy.choose_executor(
                    self._kernels.snapshot(), self._request(kernel, replicas, gpus)
                )
                if isinstance(decision, Reject):
                    raise NoCapacity(f"this cell {decision.reason.value} ({decision.detail})")
                if isinstance(decision, RunOn):
                    replica = next(r for r in replicas if r.host_id == decision.host_id)
                    assignment = await self._commit(kernel, replica, cell, gpus)
                    if assignment is not None:
                        if waited_since is not None:
                            waited = time.monotonic() - waited_since
                            cell.say(f"kernelfleet: waited {waited:.1f} s for {_gpus(gpus)}")
                        return assignment
                elif isinstance(decision, Migrate) and kernel.replicated:
                    source = next(r for r in replicas if r.host_id == decision.from_host)
                    cell.say(
                        f"kernelfleet: moving a replica to {decision.to_host} to get {_gpus(gpus)}"
                    )
                    await self._kernels.move_replica(kernel, source, decision.to_host)
                    continue
                if waited_since is None:
                    waited_since = time.monotonic()
                    self._waiting.append(cell)
                    self._metrics.queued_cells.set(len(self._waiting))
                ahead = self._waiting.index(cell)
                why = (
                    "hosts being added" if isinstance(decision, ScaleOut) else "GPUs to be released"
                )
                cell.say(
                    f"kernelfleet: waiting for {_gpus(gpus)} ({why}) — "
                    f"{ahead} cell{'s' if ahead != 1 else ''} ahead of you"
                )
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), RECHECK_INTERVAL)
        finally:
            if cell in self._waiting:
                self._waiting.remove(cell)
                self._metrics.queued_cells.set(len(self._waiting))

    def release(self, kernel_id: str, cell_id: str) -> None:
        """The cell ended: its devices are free (its replica's memory may stay, warm)."""
        if self._ledger.release(kernel_id, cell_id=cell_id):
            self.capacity_changed()

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
        snapshot = KernelSnapshot(
            kernel.id,
            gpus,
            tuple(r.host_id for r in replicas),
            executor.host_id if executor else None,
        )
        return ExecuteRequest(snapshot, gpus)

    async def _commit(
        self, kernel: KernelRecord, replica: ReplicaRecord, cell: Cell, gpus: int
    ) -> Assignment | None:
        """Bind the GPUs; None if another cell took them first (the caller asks again)."""
        try:
            commitment = self._ledger.commit(replica.host_id, kernel.id, replica.id, cell.id, gpus)
        except GpusUnavailable:
            return None
        for other_kernel, other_replica in commitment.displaced:
            try:
                await self._kernels.release_memory(other_kernel, other_replica)
            except FleetError as e:
                log.warning("replica %s kept its GPU memory: %s", other_replica, e)
            self._ledger.mark_cold(other_kernel, other_replica)
        devices = commitment.device_ids
        return Assignment(replica.id, devices, lambda: self.release(kernel.id, cell.id))


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"
