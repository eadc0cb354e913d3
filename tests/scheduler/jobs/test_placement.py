"""`place`: a round's plan on concrete devices (pure)."""

from kernelfleet.scheduler.jobs.model import JobLease, RoundPlan
from kernelfleet.scheduler.jobs.placement import HostDevices, Placement, place

V100 = "v100"
K80 = "k80"


def plan(**leases: tuple[str, int]) -> RoundPlan:
    return RoundPlan({job: JobLease(gpu_type, gpus) for job, (gpu_type, gpus) in leases.items()})


def test_a_running_job_keeps_its_devices_when_its_lease_is_unchanged():
    hosts = [HostDevices("h1", V100, ("0", "1", "2", "3"))]
    current = {"a": Placement("h1", V100, ("2", "3"))}
    placed = place(plan(a=(V100, 2), b=(V100, 2)), hosts, current)
    assert placed == {"a": current["a"], "b": Placement("h1", V100, ("0", "1"))}


def test_a_job_whose_lease_changes_type_or_size_moves():
    hosts = [HostDevices("h1", V100, ("0", "1")), HostDevices("h2", K80, ("0", "1"))]
    current = {"a": Placement("h1", V100, ("1",))}
    assert place(plan(a=(K80, 1)), hosts, current) == {"a": Placement("h2", K80, ("0",))}
    assert place(plan(a=(V100, 2)), hosts, current) == {"a": Placement("h1", V100, ("0", "1"))}


def test_a_multi_gpu_job_goes_to_one_host_best_fit_and_waits_when_none_fits():
    hosts = [
        HostDevices("big", V100, ("0", "1", "2", "3")),
        HostDevices("small", V100, ("0", "1")),
        HostDevices("other", K80, ("0", "1", "2", "3")),
    ]
    placed = place(plan(a=(V100, 2), b=(V100, 4), c=(V100, 1)), hosts, {})
    assert placed["b"] == Placement("big", V100, ("0", "1", "2", "3")), "largest first"
    assert placed["a"] == Placement("small", V100, ("0", "1")), "the tightest host that fits"
    assert "c" not in placed, "no V100 left: it waits this round"
    scattered = [HostDevices("h1", V100, ("0",)), HostDevices("h2", V100, ("1",))]
    assert place(plan(a=(V100, 2)), scattered, {}) == {}, "never split over hosts"


def test_devices_a_cell_took_are_not_kept():
    current = {"a": Placement("h1", V100, ("0",))}
    hosts = [HostDevices("h1", V100, ("1",))]  # device 0 is a cell's now
    assert place(plan(a=(V100, 1)), hosts, current) == {"a": Placement("h1", V100, ("1",))}
