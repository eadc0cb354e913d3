"""The moving window behind the cluster subscription ratio."""

import pytest

from kernelfleet.scheduler import FleetSnapshot
from kernelfleet.scheduler.policies import cluster_subscription_ratio
from kernelfleet.scheduler.usage import UsageWindow


def test_the_window_averages_its_last_samples_only() -> None:
    window = UsageWindow(3)
    assert (window.demand, window.busy) == (0.0, 0.0)
    for demand, busy in [(6, 0), (6, 3), (9, 3), (12, 6)]:
        window.add(demand, busy)
    assert window.demand == pytest.approx(9.0)  # (6 + 9 + 12) / 3: the first sample left
    assert window.busy == pytest.approx(4.0)


def test_the_ratio_policies_see_comes_from_the_window() -> None:
    window = UsageWindow.spanning(window_s=300, interval_s=30)
    for _ in range(10):
        window.add(12, 4)
    snapshot = FleetSnapshot(hosts=(), demand_gpus=window.demand, busy_gpus=window.busy)
    assert cluster_subscription_ratio(snapshot) == pytest.approx(3.0)
    window.add(12, 0)  # one idle sample barely moves a 10-sample average
    assert window.busy == pytest.approx(3.6)


def test_a_window_needs_a_sample() -> None:
    with pytest.raises(ValueError, match="at least 1 sample"):
        UsageWindow(0)
    assert UsageWindow.spanning(window_s=1, interval_s=30).demand == 0.0
