"""Object-store entries do not outlive their use: a live kernel's superseded values are deleted
after a grace period, a kernel shut down leaves no object, and a restarted gateway keeps the
objects of the kernels it adopts while it removes those of kernels nobody knows."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.objects_gc import KernelObjectsCollector
from kernelfleet.kernels.objectstore import LocalDirectoryStore, kernel_folder_name
from kernelfleet.raft.compaction import live_keys
from kernelfleet.testing import wait_for

GRACE = 2.0
OLD = time.time() - 3600


def objects(folder: Path) -> list[Path]:
    return sorted(folder.glob("objects/*/*"))


def make_old(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (OLD, OLD), follow_symlinks=False)


def store_with_one_object(root: Path, kernel_id: str) -> Path:
    store = LocalDirectoryStore.for_kernel(root, kernel_id, fsync=False)
    store.put(b"x" * 100)
    make_old(store.root)
    return store.root


# -- the gateway's sweep, on its own -------------------------------------------------------


def collector(root: Path, state: Path, live: set[str]) -> KernelObjectsCollector:
    return KernelObjectsCollector(root, lambda: live, state, EventBus(), grace=GRACE)


def test_the_sweep_removes_only_old_folders_of_kernels_nobody_knows(tmp_path):
    root, state = tmp_path / "objects", tmp_path / "kernels.json"
    state.write_text('{"version": 1, "kernels": [{"id": "adopted"}]}')
    running = store_with_one_object(root, "running")
    adopted = store_with_one_object(root, "adopted")
    orphan = store_with_one_object(root, "orphan")
    weird = store_with_one_object(root, "a kernel/with odd id")  # a hashed folder name
    fresh = LocalDirectoryStore.for_kernel(root, "just-starting", fsync=False).root
    removed = collector(root, state, {"running", "a kernel/with odd id"}).sweep()
    assert removed == [orphan.name]
    assert running.exists()
    assert adopted.exists()
    assert weird.exists()
    assert fresh.exists()


def test_an_unreadable_state_file_stops_the_sweep(tmp_path):
    root, state = tmp_path / "objects", tmp_path / "kernels.json"
    state.write_text('{"version": 1, "kern')  # truncated
    orphan = store_with_one_object(root, "orphan")
    assert collector(root, state, set()).sweep() == []
    assert orphan.exists()


async def test_a_stopped_kernels_folder_goes_at_once(tmp_path):
    from kernelfleet.gateway.event_schemas import EventType

    root = tmp_path / "objects"
    folder = LocalDirectoryStore.for_kernel(root, "k-1", fsync=False).root
    bus = EventBus()
    gc = KernelObjectsCollector(root, set, tmp_path / "kernels.json", bus, grace=3600)
    task = asyncio.ensure_future(gc.run())
    await asyncio.sleep(0.05)
    bus.publish(EventType.KERNEL_STOPPED, {"why": "shut down"}, kernel_id="k-1")
    deadline = time.monotonic() + 5
    while folder.exists():
        assert time.monotonic() < deadline, "the folder stayed"
        await asyncio.sleep(0.02)
    task.cancel()
    assert gc.removed == [kernel_folder_name("k-1")]


def test_live_keys_leave_out_superseded_values():
    from kernelfleet.raft.entries import StateDelta

    entries = [
        (i, StateDelta(f"c{i}", "r", pointers={"a": f"{i:064x}"}).to_wire()) for i in range(5)
    ]
    assert live_keys(entries) == {f"{4:064x}"}


# -- live: a 3-replica kernel on 3 hosts ------------------------------------------------------

OVERWRITE = "import numpy as np\nfor_gc = np.full(100_000, {n}.0)\nprint(for_gc.sum())"


@pytest.fixture(scope="module")
def gc_fleet(fleet_factory):
    return fleet_factory(hosts=3, gpus=1, replicas=3, env={"KERNELFLEET_OBJECTS_GRACE": str(GRACE)})


def kernel_folder(fleet, kernel_id: str) -> Path:
    return fleet.state_dir / "gateway" / "objects" / kernel_folder_name(kernel_id)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_overwriting_a_large_array_leaves_one_object_and_shutdown_none(gc_fleet):
    fleet = gc_fleet
    kernel_id = fleet.start_kernel()
    folder = kernel_folder(fleet, kernel_id)
    client = await fleet.connect(kernel_id)
    try:
        for n in range(5):
            reply = await client.execute(OVERWRITE.format(n=n), timeout=60)
            assert reply.stdout == f"{100_000.0 * n}\n"
        wait_for(lambda: len(objects(folder)) == 1, 30, "one object left after the grace period")
        await asyncio.sleep(2 * GRACE)
        assert len(objects(folder)) == 1
        # every replica still reads the value: run it where another replica executes
        assert (await client.execute("print(for_gc[0])")).stdout == "4.0\n"
    finally:
        client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    wait_for(lambda: not folder.exists(), 10, "the kernel's folder to be removed")


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_restarted_gateway_keeps_the_objects_of_the_kernels_it_adopts(gc_fleet):
    fleet = gc_fleet
    kernel_id = fleet.start_kernel()
    folder = kernel_folder(fleet, kernel_id)
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute(OVERWRITE.format(n=7))).stdout == "700000.0\n"
    finally:
        client.close()
    wait_for(lambda: len(objects(folder)) == 1, 10, "the object")
    orphan = store_with_one_object(folder.parent, "gone-while-no-gateway-ran")
    make_old(folder)  # as if the kernel had been quiet for an hour

    # The agents pause while the gateway restarts: until they heartbeat again, the new
    # gateway runs no kernel, and its sweeps (every second here) know the kernel from its
    # state file only.
    agents = [process.pid for process in fleet.hosts.values()]
    for pid in agents:
        os.kill(pid, signal.SIGSTOP)
    try:
        fleet.restart_gateway(signal.SIGKILL)
        wait_for(lambda: not orphan.exists(), 30, "the orphan's folder to be swept")
        await asyncio.sleep(1.5)  # another sweep or so
    finally:
        for pid in agents:
            os.kill(pid, signal.SIGCONT)
    assert len(objects(folder)) == 1, "the adopted kernel's object stays"

    def adopted() -> bool:
        status, model = fleet.request("GET", f"/api/kernels/{kernel_id}")
        return status == 200 and model.get("execution_state") == "idle"

    wait_for(adopted, 60, "the kernel to be adopted")
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("print(for_gc[0])")).stdout == "7.0\n"
    finally:
        client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


# -- the replica's collector, with a stand-in for its Raft log --------------------------------


class FakeLog:
    def __init__(self, live: set[str]) -> None:
        self.is_leader = True
        self.live = live
        self.raftCommitIndex = 10
        self.matched = {"match_idx_server_a": 10, "match_idx_server_b": 10}

    def live_keys(self) -> set[str]:
        return set(self.live)

    def getStatus(self) -> dict[str, int]:
        return dict(self.matched)


async def test_the_leader_deletes_superseded_objects_once_every_member_has_the_newer_entry(
    tmp_path,
):
    from kernelfleet.kernels.replica.statesync_gc import ObjectCollector

    store = LocalDirectoryStore(tmp_path, fsync=False)
    live, old, older = (store.put(bytes([n]) * 100) for n in range(3))
    make_old(tmp_path)
    fresh = store.put(b"written just now, its entry not committed yet")
    now = [0.0]
    raft = FakeLog({live})
    gc = ObjectCollector(raft, store, grace=10, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await gc.collect() == []  # found unreferenced, the grace period starts
    now[0] = 11
    raft.matched["match_idx_server_b"] = 9  # a member has not the newer entry yet
    assert await gc.collect() == []
    raft.matched["match_idx_server_b"] = 12
    assert sorted(await gc.collect()) == sorted([old, older])
    assert sorted(store.keys()) == sorted([live, fresh])

    raft.is_leader = False  # only the leader collects; a new leader counts afresh
    now[0] = 100
    os.utime(store.path(fresh), (OLD, OLD))
    assert await gc.collect() == []
    raft.is_leader = True
    assert await gc.collect() == []
    now[0] = 111
    assert await gc.collect() == [fresh]
