"""Jobs on GPUs of one type but different speeds: placement takes the fastest devices, a lease
runs at its slowest GPU's speed, and learned throughputs are per type at speed 1.0."""

from __future__ import annotations

import pytest

from kernelfleet.gateway.jobs.planning import ThroughputMeter
from kernelfleet.scheduler.jobs.model import JobLease, RoundPlan
from kernelfleet.scheduler.jobs.placement import HostDevices, Placement, lease_speed, place


def plan(**gpus: int) -> RoundPlan:
    return RoundPlan({job: JobLease("A100", n) for job, n in gpus.items()})


def test_a_job_gets_the_fastest_free_devices_of_its_host() -> None:
    host = HostDevices("h", "A100", ("0", "1", "2", "3"), (0.8, 1.1, 0.9, 1.1))
    assert place(plan(j1=2, j2=1), [host], {}) == {
        "j1": Placement("h", "A100", ("1", "3")),
        "j2": Placement("h", "A100", ("2",)),
    }


def test_among_equal_fits_the_host_with_the_faster_lease_wins() -> None:
    slow = HostDevices("a", "A100", ("0", "1"), (1.2, 0.7))
    fast = HostDevices("b", "A100", ("0", "1"), (1.0, 0.9))
    assert place(plan(j=2), [slow, fast], {})["j"] == Placement("b", "A100", ("0", "1"))
    assert place(plan(j=1), [slow, fast], {})["j"] == Placement("a", "A100", ("0",))
    # best fit still comes first: the host with fewer free devices takes the job
    small = HostDevices("c", "A100", ("0",), (0.5,))
    assert place(plan(j=1), [fast, small], {})["j"] == Placement("c", "A100", ("0",))


def test_a_running_job_keeps_its_devices_even_if_faster_ones_are_free() -> None:
    host = HostDevices("h", "A100", ("0", "1"), (0.5, 1.0))
    now = {"j": Placement("h", "A100", ("0",))}
    assert place(plan(j=1), [host], now) == now


def test_a_lease_runs_at_its_slowest_gpu() -> None:
    speeds = {"0": 1.1, "1": 0.8}
    assert lease_speed(("0", "1"), speeds) == 0.8
    assert lease_speed(("0", "9"), speeds) == 1.0  # unknown device: 1.0
    assert lease_speed((), speeds) == 1.0


def test_rates_seen_on_a_slow_lease_are_learned_at_speed_1() -> None:
    meter = ThroughputMeter()
    meter.started(0, now=0.0)
    # 40 steps in 10 s on a lease at half speed: a typical A100 does 8 steps/s
    assert meter.report("A100", 40, now=10.0, speed=0.5) == pytest.approx(8.0)
    # the job's own figure is normalised the same way; folded into the mean (weight 0.5)
    assert meter.report("A100", 40, measured=9.0, now=10.1, speed=1.0) == pytest.approx(8.5)
    assert meter.report("A100", 40, measured=9.0, now=10.2, speed=0.0) is None
