"""The NotebookOS autoscaling formula on literal snapshots."""

from __future__ import annotations

from kernelfleet.scheduler import (
    AutoscaleConfig,
    FleetSnapshot,
    Hold,
    HostSnapshot,
    ScaleIn,
    ScaleOut,
)
from kernelfleet.scheduler.autoscale import autoscale, target_hosts


def hosts(*committed: int, replicas: int = 0) -> tuple[HostSnapshot, ...]:
    return tuple(
        HostSnapshot(f"h{i}", 8, gpus_committed=c, replicas=replicas)
        for i, c in enumerate(committed)
    )


def test_target_is_ceil_of_committed_times_headroom_plus_buffer() -> None:
    # 40 committed GPUs x 1.05 / 8 = 5.25 -> 6, + 1 buffer = 7
    snapshot = FleetSnapshot(hosts=hosts(8, 8, 8, 8, 8), gpus_per_host=8)
    assert target_hosts(snapshot, AutoscaleConfig()) == 7
    assert autoscale(snapshot, AutoscaleConfig()) == ScaleOut(2)
    pending = FleetSnapshot(hosts=hosts(8, 8, 8, 8, 8), gpus_per_host=8, hosts_pending=2)
    assert autoscale(pending, AutoscaleConfig()) == Hold()


def test_exact_multiple_does_not_round_up_by_float_noise() -> None:
    # 32 x 1.05 / 8 = 4.2 -> 5; 16 committed with headroom 1.5: 24/8 = 3 exactly -> 3 + 0
    config = AutoscaleConfig(headroom=1.5, buffer_hosts=0, min_hosts=0)
    assert target_hosts(FleetSnapshot(hosts=hosts(8, 8), gpus_per_host=8), config) == 3


def test_waiting_gpus_count_unless_disabled() -> None:
    snapshot = FleetSnapshot(hosts=hosts(0, 0, 0), gpus_per_host=8, gpus_waiting=24)
    assert target_hosts(snapshot, AutoscaleConfig()) == 5  # ceil(25.2/8)=4, +1
    assert target_hosts(snapshot, AutoscaleConfig(count_waiting=False)) == 3  # min_hosts


def test_scale_in_at_most_two_fully_idle_hosts() -> None:
    # committed 4 -> ceil(4.2/8)=1 +1 = 2 < min 3: target 3; 6 alive: surplus 3, capped at 2
    snapshot = FleetSnapshot(hosts=hosts(4, 0, 0, 0, 0, 0), gpus_per_host=8)
    assert autoscale(snapshot, AutoscaleConfig()) == ScaleIn(("h1", "h2"))


def test_scale_in_prefers_hosts_without_replicas_and_never_busy_ones() -> None:
    snapshot = FleetSnapshot(
        hosts=(
            HostSnapshot("a", 8, replicas=2),
            HostSnapshot("b", 8, replicas=0),
            HostSnapshot("c", 8, gpus_committed=1),
            HostSnapshot("d", 8, gpus_committed=1),
        ),
        gpus_per_host=8,
    )
    config = AutoscaleConfig(min_hosts=1, buffer_hosts=0)  # target ceil(2.1/8) = 1
    assert autoscale(snapshot, config) == ScaleIn(("b", "a"))
    assert autoscale(snapshot, AutoscaleConfig(max_scale_in=1, min_hosts=1)) == ScaleIn(("b",))
