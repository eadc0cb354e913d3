"""Host kinds: the validated price and revocation model, and the placement rule that keeps a
majority of every kernel's replicas on on-demand hosts (docs/economics.md, "Transient hosts")."""

from __future__ import annotations

import math

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.decisions import ScaleOut
from kernelfleet.scheduler.hostkinds import (
    ON_DEMAND,
    SPOT,
    SpotMarket,
    check_kind,
    kind_to_add,
    spot_replicas_allowed,
)
from kernelfleet.scheduler.packing import PackingPolicy
from kernelfleet.scheduler.policies import (
    FcfsBatchPolicy,
    Migrate,
    NotebookOSPolicy,
    ReservationPolicy,
)
from kernelfleet.scheduler.policy import ExecuteRequest, PlacementRequest
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot, KernelSnapshot


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("on_demand_price", -1.0, "on_demand_price must be >= 0, not -1.0"),
        ("spot_price", math.nan, "spot_price must be >= 0, not nan"),
        ("on_demand_price", 5000.0, "on_demand_price is 5000.0 $/GPU-hour: above 1000"),
        ("spot_price", 3.0, "spot_price (3.0) is above on_demand_price (2.48)"),
        ("revocation_rate_per_hour", -0.1, "revocation_rate_per_hour must be >= 0"),
        ("revocation_rate_per_hour", 1e6, "revocation_rate_per_hour is 1000000.0: above 60"),
        ("revocation_rate_per_hour", math.inf, "revocation_rate_per_hour must be >= 0, not inf"),
        ("notice_s", 1e9, "notice_s is 1000000000.0: above a day"),
        ("spot_share", 1.5, "spot_share is 1.5: a share is at most 1"),
        ("spot_extra_start_s", "16", "spot_extra_start_s must be a number, not '16'"),
    ],
)
def test_bad_prices_and_rates_are_refused_with_the_field_named(
    field: str, value: object, says: str
) -> None:
    with pytest.raises(InvalidRequest, match="host kind parameter " + _escaped(says)):
        SpotMarket(**{field: value})  # type: ignore[arg-type]


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_the_defaults_are_the_cited_figures_and_prices_follow_the_kind() -> None:
    market = SpotMarket()
    assert (market.on_demand_price, market.spot_price) == (2.48, 0.74)
    assert (market.revocation_rate_per_hour, market.notice_s) == (1 / 24, 30.0)
    assert market.spot_share == 0.0, "an on-demand-only fleet unless asked"
    assert (market.price(ON_DEMAND), market.price(SPOT)) == (2.48, 0.74)
    with pytest.raises(InvalidRequest, match="kind must be one of on-demand, spot, not 'cheap'"):
        check_kind("cheap")


def test_fewer_than_a_majority_of_replicas_may_be_on_spot() -> None:
    assert [spot_replicas_allowed(r) for r in (0, 1, 2, 3, 4, 5)] == [0, 0, 0, 1, 1, 2]
    assert spot_replicas_allowed(3, override=2) == 2
    assert spot_replicas_allowed(1, override=2) == 0, "never every replica"


def test_the_autoscaler_adds_spot_hosts_only_within_the_share() -> None:
    assert kind_to_add(0, 3, 0.0) == ON_DEMAND
    assert kind_to_add(0, 3, 1 / 3) == SPOT  # 1 of 4
    assert kind_to_add(1, 4, 1 / 3) == ON_DEMAND  # 2 of 5 would be above a third
    assert kind_to_add(1, 5, 1 / 3) == SPOT  # 2 of 6
    assert kind_to_add(5, 5, 1.0) == SPOT


def fleet(*kinds: str, gpus: int = 4, replicas: tuple[int, ...] = ()) -> FleetSnapshot:
    """Hosts h1, h2... of `kinds`, `gpus` each, with `replicas[i]` replicas on host i."""
    return FleetSnapshot(
        hosts=tuple(
            HostSnapshot(
                f"h{i + 1}",
                gpus,
                replicas=replicas[i] if i < len(replicas) else 0,
                kind=kind,
            )
            for i, kind in enumerate(kinds)
        ),
        gpus_per_host=gpus,
    )


def test_notebookos_puts_at_most_one_of_three_replicas_on_spot() -> None:
    # the spot hosts are the least loaded, so the load order alone would take all three
    snapshot = fleet(SPOT, SPOT, SPOT, ON_DEMAND, ON_DEMAND, replicas=(0, 0, 0, 5, 5))
    for policy in (NotebookOSPolicy(), PackingPolicy()):
        placement = policy.place(snapshot, PlacementRequest("k", replicas=3, gpus=1))
        assert placement.host_ids == ("h1", "h4", "h5")


def test_loosened_rule_puts_two_replicas_on_spot() -> None:
    snapshot = fleet(SPOT, SPOT, SPOT, ON_DEMAND, ON_DEMAND, replicas=(0, 0, 0, 5, 5))
    policy = NotebookOSPolicy()
    policy.max_spot_replicas = 2
    placement = policy.place(snapshot, PlacementRequest("k", replicas=3, gpus=1))
    assert placement.host_ids == ("h1", "h2", "h4")


def test_without_enough_on_demand_hosts_the_kernel_asks_for_more() -> None:
    snapshot = fleet(SPOT, SPOT, ON_DEMAND)
    decision = NotebookOSPolicy().admit(snapshot, PlacementRequest("k", replicas=3, gpus=1))
    assert type(decision).__name__ == "ScaleOut"


def test_a_single_replica_never_goes_on_spot() -> None:
    snapshot = fleet(SPOT, ON_DEMAND)
    reservation = ReservationPolicy().admit(snapshot, PlacementRequest("k", replicas=1, gpus=2))
    assert reservation.host_ids == ("h2",)  # type: ignore[union-attr]
    batch = FcfsBatchPolicy().place(snapshot, PlacementRequest("k", replicas=1, gpus=0))
    assert batch.host_ids == ("h2",)


def test_a_migration_never_brings_a_second_replica_onto_spot() -> None:
    # replicas on h1 (spot, 1 GPU free), h2, h3 (on-demand, full); the busiest, h2, moves, and
    # of the hosts with 2 free GPUs, h4 (spot, idle) and h5 (on-demand, busier), it goes to h5
    hosts = (
        HostSnapshot("h1", 4, gpus_committed=3, replicas=1, kind=SPOT),
        HostSnapshot("h2", 4, gpus_committed=4, replicas=1),
        HostSnapshot("h3", 4, gpus_committed=4, replicas=1),
        HostSnapshot("h4", 4, kind=SPOT),
        HostSnapshot("h5", 4, gpus_committed=2),
    )
    snapshot = FleetSnapshot(hosts=hosts, gpus_per_host=4)
    kernel = KernelSnapshot("k", 2, ("h1", "h2", "h3"), executor_host="h3")
    decision = NotebookOSPolicy().choose_executor(snapshot, ExecuteRequest(kernel, 2))
    assert decision == Migrate(from_host="h2", to_host="h5")
    # the spot replica itself may move to another spot host
    full = (HostSnapshot("h1", 4, gpus_committed=4, replicas=1, kind=SPOT), *hosts[1:4])
    snapshot = FleetSnapshot(hosts=(*full, HostSnapshot("h5", 4, gpus_committed=4)))
    decision = NotebookOSPolicy().choose_executor(snapshot, ExecuteRequest(kernel, 2))
    assert decision == Migrate(from_host="h1", to_host="h4")


def test_a_kernel_short_of_a_replica_gets_no_spot_replica() -> None:
    # a kernel of 3 replicas running on 2 (h2, h3) after a lost replica found no host: moving
    # h3's replica onto spot would leave one on-demand replica, and a revocation the kernel
    hosts = (
        HostSnapshot("h2", 4, gpus_committed=4, replicas=1),
        HostSnapshot("h3", 4, gpus_committed=4, replicas=1),
        HostSnapshot("h4", 4, kind=SPOT),
        HostSnapshot("h5", 4, gpus_committed=2),
    )
    snapshot = FleetSnapshot(hosts=hosts, gpus_per_host=4)
    kernel = KernelSnapshot("k", 2, ("h2", "h3"), executor_host="h2")
    decision = NotebookOSPolicy().choose_executor(snapshot, ExecuteRequest(kernel, 2))
    assert decision == Migrate(from_host="h3", to_host="h5")


def test_admission_asks_for_on_demand_hosts_when_only_they_would_do() -> None:
    request = PlacementRequest("k", replicas=3, gpus=1)
    # 1 on-demand and 2 spot hosts: the one missing host must be on-demand
    decision = NotebookOSPolicy().admit(fleet(ON_DEMAND, SPOT, SPOT), request)
    assert decision == ScaleOut(1, ON_DEMAND)
    # 1 on-demand host: of the 2 missing, one may be spot: the autoscaler chooses
    decision = NotebookOSPolicy().admit(fleet(ON_DEMAND), request)
    assert decision == ScaleOut(2, None)
