"""The built-in policies on literal snapshots, with hand-checked answers."""

from __future__ import annotations

import pytest

from kernelfleet.errors import NoCapacity
from kernelfleet.scheduler import (
    ExecuteRequest,
    FleetSnapshot,
    HostSnapshot,
    KernelSnapshot,
    Migrate,
    Placement,
    PlacementRequest,
    Queue,
    QueueReason,
    Reject,
    RejectReason,
    RunOn,
    ScaleOut,
)
from kernelfleet.scheduler.policies import (
    FcfsBatchPolicy,
    NotebookOSPolicy,
    ReservationPolicy,
    cluster_subscription_ratio,
    migration_target,
)


def host(name: str, total: int = 8, sub: int = 0, com: int = 0, rep: int = 0) -> HostSnapshot:
    return HostSnapshot(name, total, gpus_subscribed=sub, gpus_committed=com, replicas=rep)


def fleet(*hosts: HostSnapshot, **fields: float) -> FleetSnapshot:
    return FleetSnapshot(hosts=hosts, gpus_per_host=8, **fields)


def cell(gpus: int, replicas: tuple[str, ...], executor: str | None = None) -> ExecuteRequest:
    return ExecuteRequest(KernelSnapshot("k", gpus, replicas, executor), gpus)


@pytest.mark.parametrize(
    ("demand", "busy", "ratio"),
    [(10.0, 5.0, 2.0), (100.0, 5.0, 7.0), (3.0, 0.0, 7.0), (2.0, 4.0, 1.0), (0.0, 0.0, 7.0)],
)
def test_cluster_subscription_ratio_is_capped_at_7(demand: float, busy: float, ratio: float):
    assert cluster_subscription_ratio(fleet(demand_gpus=demand, busy_gpus=busy)) == ratio


def test_notebookos_refuses_hosts_above_the_cluster_ratio() -> None:
    # ratio = 16/8 = 2. Placing 4 GPUs: a: (12+4)/8 = 2 ok; b: (13+4)/8 = 2.125 refused;
    # c: 4/8 ok; d: 0.5 ok. Least loaded by replicas then idle GPUs: d(0), c(1), a(3).
    snapshot = fleet(
        host("a", sub=12, rep=3),
        host("b", sub=13, rep=0),
        host("c", sub=0, rep=1),
        host("d", sub=0, rep=0),
        demand_gpus=16,
        busy_gpus=8,
    )
    decision = NotebookOSPolicy().admit(snapshot, PlacementRequest("k", replicas=3, gpus=4))
    assert decision == Placement(("d", "c", "a"))


def test_notebookos_scales_out_when_too_few_hosts_accept() -> None:
    snapshot = fleet(host("a", sub=16), host("b"), demand_gpus=8, busy_gpus=8)  # ratio 1
    policy = NotebookOSPolicy()
    request = PlacementRequest("k", replicas=3, gpus=4)
    assert policy.admit(snapshot, request) == ScaleOut(2)  # only b accepts (4/8 <= 1)
    with pytest.raises(NoCapacity, match="needs 2 more host"):
        policy.place(snapshot, request)
    pending = fleet(host("a", sub=16), host("b"), demand_gpus=8, busy_gpus=8, hosts_pending=2)
    decision = policy.admit(pending, request)
    assert isinstance(decision, Queue)
    assert decision.reason is QueueReason.SUBSCRIPTION_FULL


def test_notebookos_over_the_ratio_spreads_when_no_host_can_be_added() -> None:
    # ratio 1 refuses a (16/8) and b (9/8); a fleet that cannot grow (gpus_per_host 0, no
    # autoscaler) places anyway on the least loaded hosts instead of refusing forever.
    hosts = (host("a", sub=16, rep=4), host("b", sub=5, rep=2), host("c", total=2))
    request = PlacementRequest("k", replicas=2, gpus=4)
    growing = fleet(*hosts, demand_gpus=8, busy_gpus=8)
    # 2 replicas: neither may be on spot, so the hosts asked for are on-demand ones
    assert NotebookOSPolicy().admit(growing, request) == ScaleOut(2, "on-demand")
    fixed = FleetSnapshot(hosts=hosts, demand_gpus=8, busy_gpus=8)
    assert NotebookOSPolicy().admit(fixed, request) == Placement(("b", "a"))  # c is too small
    # a host on its way (the last the limit allows) is waited for, not overridden
    arriving = FleetSnapshot(hosts=hosts, demand_gpus=8, busy_gpus=8, hosts_pending=1)
    assert isinstance(NotebookOSPolicy().admit(arriving, request), Queue)


def test_notebookos_rejects_a_cell_larger_than_any_host() -> None:
    decision = NotebookOSPolicy().choose_executor(fleet(host("a")), cell(9, ("a",)))
    assert isinstance(decision, Reject)
    assert decision.reason is RejectReason.LARGER_THAN_ANY_HOST


def test_notebookos_prefers_the_previous_executor() -> None:
    snapshot = fleet(host("a", com=4), host("b"), host("c"))
    assert NotebookOSPolicy().choose_executor(snapshot, cell(4, ("a", "b", "c"), "a")) == RunOn("a")


def test_notebookos_else_the_replica_with_most_idle_gpus() -> None:
    snapshot = fleet(host("a", com=6), host("b", com=4), host("c", com=2))
    assert NotebookOSPolicy().choose_executor(snapshot, cell(4, ("a", "b", "c"), "a")) == RunOn("c")


def test_notebookos_else_migrates_the_busiest_replica_to_the_least_loaded_host() -> None:
    # no replica host has 4 idle; d (4 committed) and e (2 committed) can: e is least loaded.
    # the busiest replica host is a (8 committed, 0 idle).
    snapshot = fleet(
        host("a", com=8), host("b", com=6), host("c", com=6), host("d", com=4), host("e", com=2)
    )
    decision = NotebookOSPolicy().choose_executor(snapshot, cell(4, ("a", "b", "c"), "b"))
    assert decision == Migrate(from_host="a", to_host="e")


def test_notebookos_migration_avoids_the_previous_executor_on_ties() -> None:
    snapshot = fleet(host("a", com=6), host("b", com=6), host("c", com=6), host("d"))
    decision = NotebookOSPolicy().choose_executor(snapshot, cell(4, ("a", "b", "c"), "a"))
    assert decision == Migrate(from_host="b", to_host="d")


def test_notebookos_else_scales_out_once() -> None:
    full = (host("a", com=8), host("b", com=8), host("c", com=8))
    policy = NotebookOSPolicy()
    assert policy.choose_executor(fleet(*full), cell(1, ("a", "b", "c"))) == ScaleOut(1)
    waiting = policy.choose_executor(fleet(*full, hosts_pending=1), cell(1, ("a", "b", "c")))
    assert isinstance(waiting, Queue)
    assert waiting.reason is QueueReason.WAITING_FOR_GPUS


def test_migration_target_is_least_committed_then_least_subscribed() -> None:
    snapshot = fleet(host("a", com=2), host("b", com=0, sub=8), host("c", com=0, sub=4))
    chosen = migration_target(snapshot, 4, exclude=())
    assert chosen is not None
    assert chosen.id == "c"
    assert migration_target(snapshot, 8, exclude=("b", "c")) is None


def test_reservation_best_fit_then_scale_out() -> None:
    snapshot = fleet(host("a", com=2), host("b", com=4), host("c", com=6))
    policy = ReservationPolicy()
    assert policy.admit(snapshot, PlacementRequest("k", gpus=4)) == Placement(("b",))
    assert policy.admit(snapshot, PlacementRequest("k", gpus=8)) == ScaleOut(1)
    assert policy.choose_executor(snapshot, cell(4, ("b",), "b")) == RunOn("b")


def test_fcfs_batch_takes_no_host_between_cells_and_best_fit_per_cell() -> None:
    snapshot = fleet(host("a", com=2), host("b", com=4))
    policy = FcfsBatchPolicy()
    assert policy.admit(snapshot, PlacementRequest("k", gpus=4)) == Placement(())
    assert policy.choose_executor(snapshot, cell(4, ())) == RunOn("b")
    assert policy.choose_executor(snapshot, cell(8, ())) == ScaleOut(1)


def test_gateway_style_snapshot_still_places() -> None:
    """The gateway passes hosts only (no ratio window, no host size)."""
    snapshot = FleetSnapshot(hosts=(HostSnapshot("h1", 0), HostSnapshot("h2", 0)))
    assert NotebookOSPolicy().place(snapshot, PlacementRequest("k", 2, 0)).host_ids == ("h1", "h2")
    with pytest.raises(NoCapacity, match="the largest has 0"):
        NotebookOSPolicy().place(snapshot, PlacementRequest("k", 1, 1))
