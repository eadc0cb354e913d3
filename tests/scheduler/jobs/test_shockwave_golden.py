"""Shockwave against Gavel's max-min fairness on Shockwave's 120-job dynamic trace (32 GPUs,
120 s rounds, ``tacc_32gpus.json``, HiGHS 15 s), compared with the figures measured with
Shockwave's own code (../shared/data/README.md): Shockwave makespan 6.73 h, average JCT 2.76 h,
worst finish-time-fairness rho 1.60; max-min fairness 9.22 h, 3.13 h, 2.95.

About 45 s for Shockwave on two cores, hence ``slow``. Measured here: Shockwave 5.84 h, 2.72 h,
rho 1.20; max-min fairness 8.57 h, 2.82 h, rho 2.59. The average JCT is within 5 %, and both of
the paper's claims hold (a shorter makespan, a far better worst rho); the makespan and worst rho
are not within 5 % of Shockwave's own run. What is established:

- the jobs' work is the same: Shockwave's published result pickles (scheduler/reproduce/pickles/
  tacc_32gpus in its repository) record each job's run time; they total 175.6 GPU-hours, as
  `DynamicThroughput` does here (175.6), each job within 9 %;
- so the gap is in the schedule: Shockwave's own run keeps its GPUs 82 % busy, this one 94 %. Its
  run ends with the ResNet-50 job of line 35 (4.08 h alone, arrived at 0.45 h) finishing at
  6.72 h; here that job ends at 5.81 h, next to the bound of 5.70 h that line 101 sets (an LM job
  of 4.56 h alone arriving at 1.13 h);
- `PRIORITY_CAP` is not the cause: with it at 1e30 the run gives 5.84 h again;
- nor is the log approximation's encoding: Shockwave's SOS2 binaries, on this run's windows of
  24, 63 and 109 jobs, solve in 0.05, 0.9 and 1.9 s (the hypograph here: 0.02, 0.25, 0.25 s),
  far from the 15 s limit.

Not yet measured apart, the remaining differences in what the planner sees: this simulator's
`JobView` carries no ``epochs`` / ``regime_throughputs``, so the posterior sees one regime
(filled in, an experiment of two lines in the simulator's ``_Running.view``: 6.07 h, 2.72 h, rho
1.12); Shockwave's planner reads each job's batch-size schedule and epoch durations from a
pre-generated profile (Accordion's there with a 30 %-of-epochs warm-up its simulator does not
apply) and rescales those durations when measured throughput differs by over 40 %; Shockwave's
rho divides by that profile's duration, this simulator's by the job's own dynamics.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.dynamics import dynamic_jobs_from_trace
from kernelfleet.scheduler.jobs.gavel import MaxMinFairnessPolicy
from kernelfleet.scheduler.jobs.shockwave import ShockwavePolicy
from kernelfleet.scheduler.jobs.simulator import JobsRunResult, simulate_jobs
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.traces import read_job_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "shockwave"
TRACE = DATA / "traces" / "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic.trace"
HOUR = 3600.0


def run(policy_name: str) -> JobsRunResult:
    for needed in (TRACE, DATA / "tacc_throughputs.json", DATA / "configurations"):
        if not needed.exists():
            pytest.fail(f"Shockwave's artifacts are missing: looked for {needed}")
    table = ThroughputTable.load(DATA / "tacc_throughputs.json")
    jobs = dynamic_jobs_from_trace(read_job_trace(TRACE), table, ["v100"])
    policy = (
        ShockwavePolicy(DATA / "configurations" / "tacc_32gpus.json")
        if policy_name == "shockwave"
        else MaxMinFairnessPolicy()
    )
    return simulate_jobs(jobs, {"v100": 32}, policy, round_s=120.0, fallback=MaxMinFairnessPolicy())


@pytest.fixture(scope="module")
def shockwave() -> JobsRunResult:
    return run("shockwave")


@pytest.fixture(scope="module")
def max_min_fairness() -> JobsRunResult:
    return run("max_min_fairness")


@pytest.mark.slow
def test_shockwave_finishes_every_job_sooner_and_fairer_than_max_min_fairness(
    shockwave, max_min_fairness
):
    assert shockwave.jobs == max_min_fairness.jobs == 120
    assert not shockwave.fallbacks
    # the paper's claims: a shorter makespan and a far better worst finish-time fairness
    assert shockwave.makespan_s < 0.8 * max_min_fairness.makespan_s
    assert shockwave.ftf_rho.max < 0.6 * max_min_fairness.ftf_rho.max
    assert shockwave.avg_jct_s < max_min_fairness.avg_jct_s


@pytest.mark.slow
def test_shockwave_average_jct_matches_shockwave_s_own_code(shockwave):
    assert shockwave.avg_jct_s / HOUR == pytest.approx(2.76, rel=0.05)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="5.84 h and rho 1.20 here against 6.73 h and 1.60 measured with Shockwave's code: "
    "the jobs' work matches; the difference is in the schedule (see the module's docstring)",
)
def test_shockwave_makespan_and_worst_rho_match_shockwave_s_own_code(shockwave):
    assert shockwave.makespan_s / HOUR == pytest.approx(6.73, rel=0.05)
    assert shockwave.ftf_rho.max == pytest.approx(1.60, rel=0.05)
