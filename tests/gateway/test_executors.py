"""ExecutorChooser on a real ledger and the real notebookos policy: who waits, in which order.

The kernel service is replaced by a small stand-in that builds snapshots from the ledger, as the
service does; cells are real `Cell` objects whose status lines are recorded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from kernelfleet.gateway.cells import Assignment, Cell
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.executors import ExecutorChooser
from kernelfleet.gateway.framing import ClientMessage
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord, ReplicaState
from kernelfleet.scheduler import FleetSnapshot
from kernelfleet.scheduler.policies import NotebookOSPolicy

NOWHERE = ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key")


@dataclass
class StatusLines:
    """Stands in for a `ClientLink`: keeps what each cell was told."""

    said: dict[str, list[str]] = field(default_factory=dict)

    def show_cell_status(self, cell: Cell, text: str) -> None:
        self.said.setdefault(cell.id, []).append(text)


class Kernels:
    """What the chooser needs from the kernel service, over a real ledger."""

    def __init__(self, ledger: GpuLedger) -> None:
        self.ledger = ledger

    def snapshot(self, kernel: KernelRecord | None = None) -> FleetSnapshot:
        return FleetSnapshot(hosts=self.ledger.snapshot())

    async def move_replica(self, kernel: KernelRecord, replica: ReplicaRecord, host: str) -> None:
        raise AssertionError("single-replica kernels never move")

    async def release_memory(self, kernel_id: str, replica_id: str) -> None:
        pass


@pytest.fixture
def fleet():
    ledger = GpuLedger()
    ledger.set_host("h1", ["0", "1"])
    chooser = ExecutorChooser(NotebookOSPolicy(), ledger, Kernels(ledger), FleetMetrics())
    return SimpleNamespace(ledger=ledger, chooser=chooser, lines=StatusLines())


def kernel_on(fleet, name: str, gpus: int) -> KernelRecord:
    replica = ReplicaRecord(f"{name}-r", "h1", NOWHERE, state=ReplicaState.READY)
    kernel = KernelRecord(id=name, name="python3", env={}, gpus=gpus, replicas=[replica])
    kernel.link = SimpleNamespace(feeds={replica.id: None})  # type: ignore[assignment]
    fleet.ledger.subscribe("h1", name, replica.id, gpus)
    return kernel


def cell(fleet, cell_id: str) -> Cell:
    message = ClientMessage("shell", "execute_request", cell_id, [])
    return Cell(message, fleet.lines, None, stop_on_error=True, received_at=0.0)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_big_waiting_cell_is_not_starved_by_smaller_ones(fleet) -> None:
    holder, big, small = (kernel_on(fleet, k, g) for k, g in [("a", 1), ("b", 2), ("c", 1)])
    first: Assignment = await fleet.chooser.assign(holder, cell(fleet, "x"))
    assert first.devices == ("0",)

    waits_for_two = asyncio.create_task(fleet.chooser.assign(big, cell(fleet, "w")))
    await settle()
    assert fleet.chooser.waiting_gpus == 2
    # One GPU is free, but the older cell needs it too: the newer 1-GPU cell waits behind it.
    waits_behind = asyncio.create_task(fleet.chooser.assign(small, cell(fleet, "n")))
    await settle()
    assert not waits_behind.done()
    assert fleet.lines.said["n"][-1].endswith("1 cell ahead of you")
    assert fleet.chooser.waiting == 2

    first.release()
    second = await asyncio.wait_for(waits_for_two, 1)
    assert sorted(second.devices) == ["0", "1"]
    assert fleet.lines.said["w"][-1].startswith("kernelfleet: waited")
    await settle()
    assert not waits_behind.done(), "both GPUs are the big cell's now"

    second.release()
    third = await asyncio.wait_for(waits_behind, 1)
    assert len(third.devices) == 1
    assert fleet.chooser.waiting == 0
    fleet.ledger.check_invariants()


async def test_waiting_cells_get_freed_gpus_oldest_first(fleet) -> None:
    kernels = [kernel_on(fleet, name, 1) for name in "abcd"]
    holders = [await fleet.chooser.assign(k, cell(fleet, f"hold-{k.id}")) for k in kernels[:2]]
    older = asyncio.create_task(fleet.chooser.assign(kernels[2], cell(fleet, "older")))
    await settle()
    younger = asyncio.create_task(fleet.chooser.assign(kernels[3], cell(fleet, "younger")))
    await settle()

    holders[1].release()
    await settle()
    assert older.done()
    assert not younger.done()
    holders[0].release()
    await asyncio.wait_for(younger, 1)


async def test_a_cancelled_wait_lets_younger_cells_go(fleet) -> None:
    holder, big, small = (kernel_on(fleet, k, g) for k, g in [("a", 1), ("b", 2), ("c", 1)])
    await fleet.chooser.assign(holder, cell(fleet, "x"))
    waits_for_two = asyncio.create_task(fleet.chooser.assign(big, cell(fleet, "w")))
    await settle()
    waits_behind = asyncio.create_task(fleet.chooser.assign(small, cell(fleet, "n")))
    await settle()
    assert not waits_behind.done()

    waits_for_two.cancel()  # the user interrupted the older cell
    with pytest.raises(asyncio.CancelledError):
        await waits_for_two
    assigned = await asyncio.wait_for(waits_behind, 1)
    assert assigned.devices == ("1",)
    assert fleet.chooser.waiting == 0


async def test_cells_needing_no_gpu_never_wait(fleet) -> None:
    holder, big, free = (kernel_on(fleet, k, g) for k, g in [("a", 2), ("b", 2), ("c", 0)])
    await fleet.chooser.assign(holder, cell(fleet, "x"))
    waiting = asyncio.create_task(fleet.chooser.assign(big, cell(fleet, "w")))
    await settle()
    assert (await fleet.chooser.assign(free, cell(fleet, "n"))).devices == ()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
