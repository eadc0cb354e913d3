"""checkfreq's checkpoints in a kernel's object-store folder outlive the object collectors while
the kernel lives: the leader's collector of superseded objects and the gateway's sweep of folders
of kernels that are gone both leave the ``checkfreq/`` subfolder alone."""

from __future__ import annotations

from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.objects_gc import KernelObjectsCollector
from kernelfleet.kernels.objectstore import LocalDirectoryStore
from kernelfleet.kernels.replica.statesync_gc import ObjectCollector
from tests.kernels.test_gc_objects import FakeLog, make_old


def a_checkpoint_in(store: LocalDirectoryStore) -> list[str]:
    folder = store.root / "checkfreq" / "step-000000000010"
    folder.mkdir(parents=True)
    for name in (".metadata", "__0_0.distcp", "checkfreq.json", "extra.pt"):
        (folder / name).write_bytes(b"x" * 10)
    (store.root / "checkfreq" / "latest").write_text("step-000000000010\n")
    return sorted(str(p.relative_to(store.root)) for p in (store.root / "checkfreq").rglob("*"))


async def test_the_leaders_collector_deletes_only_objects(tmp_path):
    store = LocalDirectoryStore.for_kernel(tmp_path, "k-1", fsync=False)
    superseded = store.put(b"an old value" * 10)
    files = a_checkpoint_in(store)
    make_old(store.root)
    now = [0.0]
    gc = ObjectCollector(FakeLog(set()), store, grace=1, clock=lambda: now[0])  # type: ignore[arg-type]
    await gc.collect()
    now[0] = 5
    assert await gc.collect() == [superseded]
    store.sweep_partials(max_age_s=0)
    left = sorted(str(p.relative_to(store.root)) for p in (store.root / "checkfreq").rglob("*"))
    assert left == files


def test_the_gateways_sweep_keeps_a_live_kernels_folder(tmp_path):
    root, state = tmp_path / "objects", tmp_path / "kernels.json"
    state.write_text('{"version": 1, "kernels": []}')
    running = LocalDirectoryStore.for_kernel(root, "running", fsync=False)
    files = a_checkpoint_in(running)
    make_old(running.root)
    sweep = KernelObjectsCollector(root, lambda: {"running"}, state, EventBus(), grace=1)
    assert sweep.sweep() == []
    assert (running.root / "checkfreq" / "latest").read_text() == "step-000000000010\n"
    assert len(files) == 6
