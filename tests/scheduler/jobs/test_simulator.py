"""The job simulator: exact small cases, the throughput-model plug-in, and Gavel's published
physical-cluster figures (`../shared/data/README.md`) reproduced within 5 %."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs import gavel
from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot
from kernelfleet.scheduler.jobs.policy import JobPolicy, SolverFailed
from kernelfleet.scheduler.jobs.simulator import (
    JobsRunResult,
    SimulatedJob,
    SimulationError,
    StaticThroughput,
    alone_s,
    jobs_from_trace,
    simulate_jobs,
)
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.traces import read_job_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"the papers' data is not at {DATA}")
GAVEL_CLUSTER = {"v100": 8, "p100": 16, "k80": 24}
HOUR = 3600.0


def static(
    job_id: str, steps: int, arrival_s: float = 0.0, scale_factor: int = 1, **rates: float
) -> SimulatedJob:
    return SimulatedJob(
        job_id, "t", scale_factor, steps, arrival_s, StaticThroughput(rates or {"g": 1.0})
    )


def test_a_lone_job_finishes_mid_round_at_its_exact_time() -> None:
    result = simulate_jobs([static("a", 1000, g=2.0)], {"g": 1}, gavel.MaxMinFairnessPolicy())
    assert result.avg_jct_s == pytest.approx(500.0)
    assert result.makespan_s == pytest.approx(500.0)
    assert result.utilisation == pytest.approx(1.0)
    assert result.rounds == 2
    assert result.ftf_rho.max == pytest.approx(1.0)
    assert result.as_document()["jobs"] == 1


def test_two_jobs_share_one_gpu_round_by_round() -> None:
    # Each needs two rounds alone; they alternate: a runs rounds 0 and 2, b rounds 1 and 3.
    jobs = [static("a", 720), static("b", 720)]
    result = simulate_jobs(jobs, {"g": 1}, gavel.MaxMinFairnessPolicy())
    finish = {outcome.job_id: outcome.finish_s for outcome in result.outcomes}
    assert finish == {"a": pytest.approx(3 * 360.0), "b": pytest.approx(4 * 360.0)}
    assert result.makespan_s == pytest.approx(1440.0)
    # rho = JCT / (alone 720 s x max(1, 2 jobs / 1 GPU)).
    assert result.ftf_rho.max == pytest.approx(1440.0 / (720.0 * 2))
    assert result.ftf_rho.unfair_share == 0.0


def test_arrivals_wait_for_the_round_and_idle_time_is_skipped() -> None:
    jobs = [static("a", 100), static("late", 100, arrival_s=5000.0)]
    result = simulate_jobs(jobs, {"g": 2}, gavel.MaxMinFairnessPolicy())
    jct = {outcome.job_id: outcome.jct_s for outcome in result.outcomes}
    assert jct == {"a": pytest.approx(100.0), "late": pytest.approx(100.0)}
    assert result.makespan_s == pytest.approx(5100.0)
    assert result.utilisation == pytest.approx(200.0 / (2 * 5100.0))


def test_a_job_arriving_mid_round_starts_at_the_next_round() -> None:
    jobs = [static("long", 3600), static("mid", 100, arrival_s=100.0)]
    result = simulate_jobs(
        jobs, {"g": 2}, gavel.MaxMinFairnessPolicy(), reallocation_interval_s=0.0
    )
    mid = next(outcome for outcome in result.outcomes if outcome.job_id == "mid")
    assert mid.finish_s == pytest.approx(360.0 + 100.0)


class Accelerating:
    """A throughput model whose rate doubles halfway (a batch size that grows)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def steps_per_s(self, gpu_type: str, steps_done: float) -> float:
        return 1.0 if steps_done < self.steps / 2 else 2.0

    def batch_size(self, steps_done: float) -> int | None:
        return 32 if steps_done < self.steps / 2 else 64


def test_a_dynamic_throughput_model_plugs_in() -> None:
    job = SimulatedJob("dyn", "t", 1, 1200, 0.0, Accelerating(1200), mode="gns")
    result = simulate_jobs([job], {"g": 1}, gavel.MaxMinFairnessPolicy())
    assert result.avg_jct_s == pytest.approx(600.0 + 300.0, rel=0.02)
    assert alone_s(job, ["g"]) == pytest.approx(900.0, rel=1e-6)


class Refusing(JobPolicy):
    name = "refusing"

    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        raise SolverFailed("out of time")


def test_solver_failure_falls_back_and_is_reported() -> None:
    jobs = [static("a", 100)]
    with pytest.raises(SolverFailed):
        simulate_jobs(jobs, {"g": 1}, Refusing())
    result = simulate_jobs(jobs, {"g": 1}, Refusing(), fallback=gavel.FifoPerfPolicy())
    assert result.avg_jct_s == pytest.approx(100.0)
    assert result.fallbacks == ("t=0s: out of time",)


def test_jobs_that_can_never_run_are_refused_up_front() -> None:
    with pytest.raises(SimulationError, match=r"job wide \(t, 4 GPU\(s\)\) can run on no GPU type"):
        simulate_jobs([static("wide", 10, scale_factor=4)], {"g": 2}, gavel.FifoPolicy())
    with pytest.raises(SimulationError, match="no GPUs"):
        simulate_jobs([static("a", 10)], {"g": 0}, gavel.FifoPolicy())
    with pytest.raises(SimulationError, match="round length"):
        simulate_jobs([static("a", 10)], {"g": 1}, gavel.FifoPolicy(), round_s=0)


def test_progress_reaches_one() -> None:
    seen: list[float] = []
    simulate_jobs(
        [static("a", 400), static("b", 800)], {"g": 1}, gavel.FifoPolicy(), progress=seen.append
    )
    assert seen == sorted(seen)
    assert seen[-1] == 1.0


# -- Gavel's physical-cluster figures -------------------------------------------------------------


def run_trace(trace: str, policies: Sequence[JobPolicy]) -> dict[str, JobsRunResult]:
    """Gavel's physical-cluster setting: its physical-cluster throughputs, 8 V100 : 16 P100 :
    24 K80, 6-minute rounds. Prints each run's wall time."""
    table = ThroughputTable.load(DATA / "gavel" / "physical_cluster_throughputs.json")
    jobs = jobs_from_trace(read_job_trace(DATA / "gavel" / "traces" / trace), table, GAVEL_CLUSTER)
    results = {}
    for policy in policies:
        started = time.perf_counter()
        results[policy.name] = simulate_jobs(jobs, GAVEL_CLUSTER, policy, round_s=360.0)
        print(f"{trace} {policy.name}: {time.perf_counter() - started:.2f} s wall")
    return results


@needs_data
def test_gavel_las_trace_average_jct_agnostic_to_aware() -> None:
    results = run_trace(
        "max_min_fairness.trace",
        [gavel.MaxMinFairnessPolicy(), gavel.MaxMinFairnessPerfPolicy()],
    )
    agnostic, aware = results["max_min_fairness"], results["max_min_fairness_perf"]
    assert agnostic.jobs == aware.jobs == 96
    assert agnostic.avg_jct_s / HOUR == pytest.approx(5.20, rel=0.05)
    assert aware.avg_jct_s / HOUR == pytest.approx(3.82, rel=0.05)


@needs_data
def test_gavel_makespan_trace_agnostic_to_aware() -> None:
    results = run_trace(
        "minimize_makespan.trace",
        [gavel.MinTotalDurationPolicy(), gavel.MinTotalDurationPerfPolicy()],
    )
    agnostic, aware = results["min_total_duration"], results["min_total_duration_perf"]
    assert agnostic.jobs == aware.jobs == 100
    assert agnostic.makespan_s / HOUR == pytest.approx(20.71, rel=0.05)
    assert aware.makespan_s / HOUR == pytest.approx(17.40, rel=0.05)


@needs_data
@pytest.mark.xfail(
    strict=True,
    reason=(
        "Gavel's 70.38 h is the makespan of its agnostic fifo on the makespan trace, and comes "
        "from a bug in that policy: a stale loop variable sends every job to the "
        "alphabetically last GPU type with a free GPU (the V100s), oversubscribing them while "
        "P100s and K80s idle. This FIFO draws the type at random among those with room, as "
        "the policy intends (docs/jobs-simulator.md)."
    ),
)
def test_gavel_fifo_makespan_figure() -> None:
    (result,) = run_trace("minimize_makespan.trace", [gavel.FifoPolicy()]).values()
    assert result.makespan_s / HOUR == pytest.approx(70.38, rel=0.05)
