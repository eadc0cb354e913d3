"""Shockwave against Gavel's max-min fairness on Shockwave's 120-job dynamic trace (32 GPUs,
120 s rounds, ``tacc_32gpus.json``, HiGHS 15 s), compared with the figures measured with
Shockwave's own code (../shared/data/README.md): Shockwave makespan 6.73 h, average JCT 2.76 h,
worst finish-time-fairness rho 1.60; max-min fairness 9.22 h, 3.13 h, 2.95.

The experiment is run as Shockwave's simulator runs it (docs/jobs-simulator.md, "Shockwave's
dynamic trace"): a job that runs after a round it sat out pays 20 s to restore its checkpoint,
Gavel's mechanism reallocates at most every 1000 s, and rho divides by the duration of the job's
pre-generated profile. About 45 s for Shockwave and 10 s for max-min fairness on two cores, hence
``slow``. Measured here: Shockwave 6.48 h, 2.80 h, rho 1.21; max-min fairness 9.17 h, 3.19 h,
rho 2.79.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.dynamics import dynamic_jobs_from_trace
from kernelfleet.scheduler.jobs.gavel import MaxMinFairnessPolicy
from kernelfleet.scheduler.jobs.shockwave import ShockwavePolicy
from kernelfleet.scheduler.jobs.simulator import (
    SHOCKWAVE_REALLOCATION_INTERVAL_S,
    SHOCKWAVE_RESUME_OVERHEAD_S,
    JobsRunResult,
    simulate_jobs,
)
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.traces import read_job_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "shockwave"
TRACE = DATA / "traces" / "120_0.2_5_100_40_25_0,0.5,0.5_0.6,0.3,0.09,0.01_multigpu_dynamic.trace"
HOUR = 3600.0

# Each module fixture replays the 120-job trace (45-55 s quiet; the Shockwave one solves a MILP
# every round). pytest-timeout counts a fixture's setup in its first test, and on a 2-core host
# loaded to 10 by other suites that passed the 120 s default.
pytestmark = pytest.mark.timeout(360)


def run(policy_name: str) -> JobsRunResult:
    for needed in (TRACE, DATA / "tacc_throughputs.json", DATA / "configurations"):
        if not needed.exists():
            pytest.fail(f"Shockwave's artifacts are missing: looked for {needed}")
    table = ThroughputTable.load(DATA / "tacc_throughputs.json")
    jobs = dynamic_jobs_from_trace(read_job_trace(TRACE), table, ["v100"], alone_from_profile=True)
    policy = (
        ShockwavePolicy(DATA / "configurations" / "tacc_32gpus.json")
        if policy_name == "shockwave"
        else MaxMinFairnessPolicy()
    )
    return simulate_jobs(
        jobs,
        {"v100": 32},
        policy,
        round_s=120.0,
        fallback=MaxMinFairnessPolicy(),
        resume_overhead_s=SHOCKWAVE_RESUME_OVERHEAD_S,
        reallocation_interval_s=SHOCKWAVE_REALLOCATION_INTERVAL_S,
    )


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
def test_max_min_fairness_makespan_and_average_jct_match_shockwave_s_own_code(max_min_fairness):
    assert max_min_fairness.makespan_s / HOUR == pytest.approx(9.22, rel=0.05)
    assert max_min_fairness.avg_jct_s / HOUR == pytest.approx(3.13, rel=0.05)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="2.79 here against 2.95: the same five jobs are the least fairly treated, in the same "
    "order, each within 6 %; the rest is an artefact of Shockwave's simulator not modelled here "
    "(its first reset at t=0 leaves the never-reset sentinel _last_reset_time == 0 in place, so "
    "it reallocates again in round 2; re-created, 2.84): docs/jobs-simulator.md",
)
def test_max_min_fairness_worst_rho_matches_shockwave_s_own_code(max_min_fairness):
    assert max_min_fairness.ftf_rho.max == pytest.approx(2.95, rel=0.05)


@pytest.mark.slow
def test_shockwave_makespan_and_average_jct_match_shockwave_s_own_code(shockwave):
    assert shockwave.makespan_s / HOUR == pytest.approx(6.73, rel=0.05)
    assert shockwave.avg_jct_s / HOUR == pytest.approx(2.76, rel=0.05)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="1.21 here against 1.60: the same jobs are chosen for the first 14 rounds; from there "
    "the plans differ by near-ties that the configured 1e-3 MIP gap leaves to the solver (a 1e-6 "
    "gap picks other jobs, and also gives 1.21), and the worst rho hangs on which job they leave "
    "waiting: Shockwave's own code gives 1.78 with Gurobi and 1.60 with HiGHS (same makespan and "
    "JCT): docs/jobs-simulator.md",
)
def test_shockwave_worst_rho_matches_shockwave_s_own_code(shockwave):
    assert shockwave.ftf_rho.max == pytest.approx(1.60, rel=0.05)
