"""Shockwave against Gavel's max-min fairness on Shockwave's 120-job dynamic trace (32 GPUs,
120 s rounds, ``tacc_32gpus.json``, HiGHS 15 s), compared with the figures measured with
Shockwave's own code (../shared/data/README.md): Shockwave makespan 6.73 h, average JCT 2.76 h,
worst finish-time-fairness rho 1.60; max-min fairness 9.22 h, 3.13 h, 2.95.

About 45 s for Shockwave on two cores, hence ``slow``. Measured here: Shockwave 5.84 h, 2.72 h,
rho 1.20; max-min fairness 8.57 h, 2.82 h, rho 2.59. The average JCT is within 5 %; the makespans
are not, for both policies alike (-13 % and -7 %), which points at the jobs' dynamics rather than
the planner. Known differences, not yet separated by measurement:

- this simulator's `JobView` does not carry a job's ``epochs`` and ``regime_throughputs``, so the
  posterior sees one regime (the current batch size); filled in (an experiment, two lines in the
  simulator's ``_Running.view``) Shockwave reaches 6.07 h, 2.72 h, rho 1.12;
- `DynamicThroughput` changes a job's batch size in the epoch the pattern says; Shockwave's
  simulator flags it at a round's end and applies it after the job's next round, so its jobs spend
  longer at their small, slower batch sizes (and it rounds progress up to an epoch at a change);
- Shockwave's planner reads each job's whole batch-size schedule from a pre-generated profile
  (Accordion's there with a 30 %-of-epochs warm-up the simulator does not apply); here it learns
  it from the batch sizes it observes.
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
    "see the module's docstring for the known differences",
)
def test_shockwave_makespan_and_worst_rho_match_shockwave_s_own_code(shockwave):
    assert shockwave.makespan_s / HOUR == pytest.approx(6.73, rel=0.05)
    assert shockwave.ftf_rho.max == pytest.approx(1.60, rel=0.05)
