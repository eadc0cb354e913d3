"""The cell policies prefer, among otherwise equal hosts, the one whose free GPUs are faster
(`HostSnapshot.free_gpu_speeds`); snapshots without speeds (the simulator's) behave as before."""

from __future__ import annotations

from kernelfleet.scheduler import (
    ExecuteRequest,
    FleetSnapshot,
    HostSnapshot,
    KernelSnapshot,
    PlacementRequest,
    RunOn,
)
from kernelfleet.scheduler.packing import PackingPolicy, best_fit_target
from kernelfleet.scheduler.policies import (
    FcfsBatchPolicy,
    NotebookOSPolicy,
    ReservationPolicy,
    migration_target,
)


def host(name: str, speeds: tuple[float, ...], committed: int = 0) -> HostSnapshot:
    """A 4-GPU host whose free GPUs have `speeds` (fastest first; () for unknown)."""
    return HostSnapshot(name, 4, gpus_committed=committed, free_gpu_speeds=speeds)


def cell(gpus: int, replicas: tuple[str, ...]) -> ExecuteRequest:
    return ExecuteRequest(KernelSnapshot("k", gpus, replicas), gpus)


SLOW = host("a", (0.9, 0.9, 0.8, 0.8))
FAST = host("b", (1.1, 1.0, 0.7, 0.7))


def test_free_speed_is_the_slowest_of_the_fastest_free_gpus() -> None:
    assert [FAST.free_speed(n) for n in (0, 1, 2, 3, 4, 5)] == [1.0, 1.1, 1.0, 0.7, 0.7, 1.0]
    assert host("c", ()).free_speed(2) == 1.0


def test_the_executor_is_the_replica_host_with_faster_free_gpus() -> None:
    snapshot = FleetSnapshot(hosts=(SLOW, FAST))
    for policy in (NotebookOSPolicy(), PackingPolicy()):
        assert policy.choose_executor(snapshot, cell(1, ("a", "b"))) == RunOn("b")
        assert policy.choose_executor(snapshot, cell(2, ("a", "b"))) == RunOn("b")
        # a 3-GPU cell runs at its slowest GPU's speed: 0.8 on a beats 0.7 on b
        assert policy.choose_executor(snapshot, cell(3, ("a", "b"))) == RunOn("a")
    assert FcfsBatchPolicy().choose_executor(snapshot, cell(1, ())) == RunOn("b")


def test_speed_only_breaks_ties() -> None:
    busier_but_faster = host("b", (1.5, 1.5), committed=2)
    snapshot = FleetSnapshot(hosts=(SLOW, busier_but_faster))
    assert NotebookOSPolicy().choose_executor(snapshot, cell(1, ("a", "b"))) == RunOn("a")
    assert PackingPolicy().choose_executor(snapshot, cell(1, ("a", "b"))) == RunOn("b")


def test_migration_targets_and_reservations_prefer_faster_gpus() -> None:
    snapshot = FleetSnapshot(hosts=(SLOW, FAST, host("c", ())))
    assert migration_target(snapshot, 1).id == "b"
    assert best_fit_target(snapshot, 1).id == "b"
    assert migration_target(snapshot, 3).id == "c"  # unknown speeds count as 1.0 > 0.8 > 0.7
    placement = ReservationPolicy().admit(snapshot, PlacementRequest("k", replicas=1, gpus=1))
    assert placement.host_ids == ("b",)  # type: ignore[union-attr]


def test_without_speeds_ties_still_go_by_host_id() -> None:
    snapshot = FleetSnapshot(hosts=(host("b", ()), host("a", ())))
    assert NotebookOSPolicy().choose_executor(snapshot, cell(1, ("b", "a"))) == RunOn("a")
