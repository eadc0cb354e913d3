"""The autoscaling rule's anti-flapping parts on literal snapshots: hysteresis (idle time and a
headroom band), the minimum host lifetime and the warm-capacity target (docs/economics.md)."""

from __future__ import annotations

import math

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler import AutoscaleConfig, FleetSnapshot, Hold, HostSnapshot, ScaleIn
from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.autoscale import (
    autoscale,
    releasable,
    scale_in_target,
    target_hosts,
    warm_gpus,
)
from kernelfleet.scheduler.decisions import ScaleOut
from kernelfleet.scheduler.snapshot import ArrivalStats

STEADY = AutoscaleConfig(buffer_hosts=0, min_hosts=1)


def fleet(now: float, *hosts: HostSnapshot, **fields: object) -> FleetSnapshot:
    return FleetSnapshot(hosts=hosts, now=now, gpus_per_host=8, **fields)  # type: ignore[arg-type]


def busy(host_id: str, gpus: int = 8) -> HostSnapshot:
    return HostSnapshot(host_id, 8, gpus_committed=gpus, started_at=0.0)


def test_an_idle_host_is_released_only_after_the_idle_time() -> None:
    idle = HostSnapshot("spare", 8, started_at=0.0, idle_since=100.0)
    config = AutoscaleConfig(buffer_hosts=0, min_hosts=1, scale_in_idle_s=60)
    assert autoscale(fleet(159.9, busy("a", 4), idle), config) == Hold()
    assert autoscale(fleet(160.0, busy("a", 4), idle), config) == ScaleIn(("spare",))
    # without the knob (NotebookOS's formula) it goes at once
    assert autoscale(fleet(100.0, busy("a", 4), idle), STEADY) == ScaleIn(("spare",))


def test_a_host_is_released_only_after_its_minimum_lifetime() -> None:
    young = HostSnapshot("young", 8, started_at=1000.0, idle_since=1000.0)
    config = AutoscaleConfig(buffer_hosts=0, min_hosts=1, min_host_lifetime_s=600)
    assert autoscale(fleet(1599.0, busy("a", 4), young), config) == Hold()
    assert autoscale(fleet(1600.0, busy("a", 4), young), config) == ScaleIn(("young",))
    assert not releasable(young, 1599.0, config)
    assert releasable(young, 1600.0, config)


def test_hosts_of_unknown_age_and_idleness_count_as_old_and_idle() -> None:
    # a caller that does not date its hosts (the defaults) keeps the formula's behaviour
    config = AutoscaleConfig(scale_in_idle_s=3600, min_host_lifetime_s=3600)
    assert releasable(HostSnapshot("h", 8), 0.0, config)
    assert not releasable(HostSnapshot("h", 8, gpus_committed=1), 0.0, config)


def test_the_scale_in_band_holds_between_the_two_targets() -> None:
    # 16 committed on 4 hosts: out target ceil(16.8/8) = 3; in target ceil(16*1.6/8) = 4
    hosts = (busy("a"), busy("b"), HostSnapshot("c", 8), HostSnapshot("d", 8))
    banded = AutoscaleConfig(buffer_hosts=0, min_hosts=1, scale_in_headroom=1.6)
    snapshot = fleet(0.0, *hosts)
    assert target_hosts(snapshot, banded) == 3
    assert scale_in_target(snapshot, banded) == 4
    assert autoscale(snapshot, banded) == Hold()
    assert autoscale(snapshot, STEADY) == ScaleIn(("c",))
    # the band does not delay a scale-out: 40 committed wants ceil(42/8) = 6 > 4
    crowded = fleet(0.0, busy("a"), busy("b"), busy("c"), busy("d"), gpus_waiting=8)
    assert autoscale(crowded, banded) == ScaleOut(2)


def test_warm_gpus_by_hand() -> None:
    # 90 cells of 2 GPUs in 900 s: 0.1 cells/s; over a lead of 90 s, 9 cells expected:
    # mean 9 * 2 = 18 GPUs, variance 9 * 4 = 36, so the 97.5% quantile is
    # 18 + 1.959964 * 6 = 29.76 -> 30 GPUs; the median is the mean, 18
    arrivals = ArrivalStats(window_s=900, cells=90, gpus=180, gpus_squared=360)
    assert warm_gpus(arrivals, AutoscaleConfig(warm_quantile=0.975, warm_lead_s=90)) == 30
    assert warm_gpus(arrivals, AutoscaleConfig(warm_quantile=0.5, warm_lead_s=90)) == 18
    assert warm_gpus(arrivals, AutoscaleConfig()) == 0  # off by default
    assert warm_gpus(ArrivalStats(900), AutoscaleConfig(warm_quantile=0.9, warm_lead_s=90)) == 0


def test_warm_gpus_grow_the_target_and_keep_idle_hosts() -> None:
    arrivals = ArrivalStats(window_s=900, cells=90, gpus=180, gpus_squared=360)
    warm = AutoscaleConfig(buffer_hosts=0, min_hosts=1, warm_quantile=0.975, warm_lead_s=90)
    empty = fleet(0.0, HostSnapshot("a", 8), arrivals=arrivals)
    assert target_hosts(empty, warm) == 4  # ceil(30 / 8)
    assert autoscale(empty, warm) == ScaleOut(3)
    four = fleet(0.0, *(HostSnapshot(h, 8) for h in "abcd"), arrivals=arrivals)
    assert autoscale(four, warm) == Hold()
    assert autoscale(four, STEADY) == ScaleIn(("a", "b"))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"scale_in_idle_s": -1.0}, "scale_in_idle_s"),
        ({"min_host_lifetime_s": math.nan}, "min_host_lifetime_s"),
        ({"headroom": 0.5}, "headroom"),
        ({"scale_in_headroom": 1.01}, "scale_in_headroom"),
        ({"warm_quantile": 1.0}, "warm_quantile"),
        ({"warm_lead_s": -5.0}, "warm_lead_s"),
    ],
)
def test_impossible_parameters_are_refused_with_the_field_named(
    fields: dict[str, float], named: str
) -> None:
    with pytest.raises(InvalidRequest, match=named):
        AutoscaleConfig(**fields)  # type: ignore[arg-type]


def test_the_arrival_window_forgets_cells_older_than_the_window() -> None:
    window = ArrivalWindow(60.0)
    window.add(0.0, 1)
    window.add(30.0, 4)
    assert window.stats(59.0) == ArrivalStats(60.0, 2, 5, 17)
    assert window.stats(60.0) == ArrivalStats(60.0, 1, 4, 16)  # (0, 60] excludes 0
    assert window.stats(90.0) == ArrivalStats(60.0, 0, 0, 0)
    assert window.stats(90.0).rate == 0.0
    with pytest.raises(ValueError, match="longer than 0"):
        ArrivalWindow(0.0)


def test_a_window_nobody_reads_stays_as_small_as_its_window() -> None:
    """The gateway records every cell, and its autoscaler may ask only every few seconds."""
    window = ArrivalWindow(10.0)
    for second in range(10_000):
        window.add(float(second), 2)
    assert len(window._cells) == 10
    assert window.stats(9_999.0) == ArrivalStats(10.0, 10, 20, 40)
