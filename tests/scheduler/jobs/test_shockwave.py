"""Shockwave's planner on problems small enough to check by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.policy import JobPolicy, SolverFailed, decide
from kernelfleet.scheduler.jobs.shockwave import ShockwaveConfig, ShockwavePolicy

TACC_CONFIG = (
    Path(__file__).resolve().parents[3].parent
    / "shared/data/shockwave/configurations/tacc_32gpus.json"
)


def job(job_id: str, total: int, done: float = 0.0, gpus: int = 1, **fields) -> JobView:
    """A job of `total` steps at 1 step/s on a v100 (so steps are seconds of work)."""
    fields.setdefault("throughputs", {"v100": 1.0})
    return JobView(job_id, "T", gpus, total, steps_done=done, **fields)


def snapshot(*jobs: JobView, gpus: int = 1, now_s: float = 0.0, **cluster) -> JobsSnapshot:
    return JobsSnapshot(now_s, cluster or {"v100": gpus}, jobs, round_s=100.0)


def running(allocation: Allocation) -> set[str]:
    return {job_id for job_id, shares in allocation.items() if shares}


class FirstJobPolicy(JobPolicy):
    """The fallback in these tests: the first job gets the first GPU type."""

    name = "first"

    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        first = snapshot.jobs[0].job_id
        return {
            j.job_id: ({snapshot.gpu_types[0]: 1.0} if j.job_id == first else {})
            for j in snapshot.jobs
        }


def test_nash_welfare_runs_the_job_with_the_least_progress():
    # one GPU, two rounds of 100 s; a is half done, b a tenth: log(progress) rises faster for b
    # (0.1 -> 0.3 is worth more than 0.5 -> 0.7), and b leaves the smaller longest remainder
    policy = ShockwavePolicy(future_rounds=2, rho_max=100.0)
    allocation = policy.allocate(snapshot(job("a", 1000, 500), job("b", 1000, 100)))
    assert allocation == {"a": {}, "b": {"v100": 1.0}}
    assert policy.last_solve is not None
    assert not policy.last_solve.relaxed


def test_priority_weight_decides_between_equal_jobs():
    policy = ShockwavePolicy(future_rounds=1, rho_max=100.0)
    allocation = policy.allocate(
        snapshot(job("light", 1000), job("heavy", 1000, priority_weight=3.0))
    )
    assert running(allocation) == {"heavy"}


# The jobs state no epochs, so the planner counts hundredths of their work (10 s) as epochs and
# reads the time after the one in progress as remaining: a (900 of 1000 done) 90 s, b (50 done)
# 940 s. One GPU, one round of 100 s, equal share 1/2, so the fair finish times are 180 s (a) and
# 1880 s (b). After the window (t = 100 s):
# - if a runs: a is done, b finishes at 100 + 940/0.5 = 1980 s, rho 1.05;
# - if b runs: a finishes at 100 + 90/0.5 = 280 s, rho 1.56; b at 1780 s.
# Nash welfare prefers b (0.05 -> 0.15 of its work against a's 0.9 -> 1.0).
def fairness_case(**options) -> tuple[ShockwavePolicy, JobsSnapshot]:
    return ShockwavePolicy(future_rounds=1, **options), snapshot(
        job("a", 1000, 900), job("b", 1000, 50)
    )


def test_finish_time_fairness_overrides_welfare_when_the_late_job_would_pass_rho_max():
    policy, snap = fairness_case(rho_max=1.2)
    assert running(policy.allocate(snap)) == {"a"}
    policy, snap = fairness_case(rho_max=2.0)
    assert running(policy.allocate(snap)) == {"b"}


def test_infeasible_fairness_raises_when_relaxation_is_off_and_the_fallback_runs():
    policy, snap = fairness_case(rho_max=1.0, relax_infeasible=False)
    with pytest.raises(SolverFailed, match="infeasible"):
        policy.allocate(snap)
    decision = decide(policy, FirstJobPolicy(), snap)
    assert decision.policy == "first"
    assert decision.fallback_reason is not None
    assert "infeasible" in decision.fallback_reason
    assert running(decision.allocation) == {"a"}


def test_relaxation_keeps_welfare_until_a_job_falls_behind_then_lifts_it():
    policy, snap = fairness_case(rho_max=1.0)
    # both projected exactly at their fair finish (rho 1): no priority, welfare picks b
    assert running(policy.allocate(snap)) == {"b"}
    assert policy.last_solve is not None
    assert policy.last_solve.relaxed
    # 1000 s later, neither has moved: a's rho is (1000 + 180) / 180 = 6.6, b's 2880 / 1880 = 1.5;
    # a's utility weighs 6.6 ** 12 (capped), b's 1.5 ** 12
    later = JobsSnapshot(1000.0, snap.cluster, snap.jobs, round_s=snap.round_s)
    assert running(policy.allocate(later)) == {"a"}


def test_a_round_never_holds_more_gpus_than_the_cluster_and_leaves_none_idle():
    jobs = (job("big", 5000, gpus=2), job("s1", 3000), job("s2", 4000, 1000))
    policy = ShockwavePolicy(future_rounds=4, rho_max=100.0)
    snap = snapshot(*jobs, gpus=2)
    chosen = running(policy.allocate(snap))
    assert sum(snap.job(job_id).scale_factor for job_id in chosen) == 2


def test_the_plan_is_replayed_until_the_jobs_change():
    jobs = (job("a", 1000, 500), job("b", 1000, 100), job("c", 800, 200))
    policy = ShockwavePolicy(future_rounds=4, rho_max=100.0)
    policy.allocate(snapshot(*jobs))
    first_solve, plan = policy.last_solve, policy._plan
    assert plan is not None
    second = policy.allocate(snapshot(*jobs, now_s=100.0))
    assert policy.last_solve is first_solve
    assert running(second) == set(plan.rounds[1])
    policy.allocate(snapshot(*jobs[:2], now_s=200.0))
    assert policy.last_solve is not first_solve


def test_jobs_go_to_the_fastest_type_with_room_and_unusable_jobs_wait():
    fast_on_v100 = {"v100": 4.0, "k80": 1.0}
    jobs = (
        job("x", 1000, throughputs=fast_on_v100),
        job("y", 1000, throughputs=fast_on_v100),
        job("nowhere", 1000, throughputs={"a100": 9.0}),
    )
    allocation = ShockwavePolicy(future_rounds=2, rho_max=100.0).allocate(
        snapshot(*jobs, v100=1, k80=1)
    )
    assert sorted(next(iter(allocation[j])) for j in ("x", "y")) == ["k80", "v100"]
    assert allocation["nowhere"] == {}


def test_no_jobs_no_allocation():
    assert ShockwavePolicy().allocate(snapshot()) == {}


def test_a_big_problem_under_a_tiny_time_limit_fails_and_the_fallback_runs():
    rng = random.Random(0)
    jobs = tuple(
        job(f"j{i}", rng.randint(10_000, 200_000), gpus=rng.choice([1, 1, 2, 4]))
        for i in range(400)
    )
    snap = snapshot(*jobs, gpus=32)
    policy = ShockwavePolicy(solver_timeout=1e-6, rho_max=100.0)
    with pytest.raises(SolverFailed, match="time limit"):
        policy.allocate(snap)
    decision = decide(policy, FirstJobPolicy(), snap)
    assert decision.fallback_reason is not None
    assert "time limit" in decision.fallback_reason
    assert running(decision.allocation) == {"j0"}


def test_options_come_from_shockwave_s_configuration_json(tmp_path):
    if not TACC_CONFIG.is_file():
        pytest.fail(f"Shockwave's configuration is missing: looked for {TACC_CONFIG}")
    config = ShockwaveConfig.load(TACC_CONFIG)
    assert (config.future_rounds, config.k, config.lam, config.rho_max) == (20, 1e-3, 12.0, 1.0)
    assert config.log_approximation_bases == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert (config.solver_timeout, config.solver_rel_gap) == (15, 1e-3)
    policy = ShockwavePolicy(str(TACC_CONFIG), solver_timeout=2.0)
    assert policy.config.solver_timeout == 2.0
    assert policy.config.future_rounds == 20
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"future_rounds": 3, "gurobi": True}))
    with pytest.raises(ValueError, match="gurobi"):
        ShockwaveConfig.load(bad)
    with pytest.raises(TypeError, match="nonsense"):
        ShockwavePolicy(nonsense=1)


def test_the_posterior_s_faster_regime_ahead_shortens_a_job_s_predicted_remainder():
    # Both run at 1 step/s now, 1000 steps left; "growing" may move to a batch size at 4 steps/s
    # (10 epochs, one seen at 32): the posterior expects about half its remaining epochs there,
    # so about 560 s left after the epoch in progress, against 990 s for the static job (whose
    # epochs are hundredths of its work). Welfare gains are equal; Shockwave's k term (the longest
    # remainder after the window) then runs the static job.
    growing = job(
        "growing",
        1000,
        batch_size=32,
        epochs=10,
        regime_throughputs={32: {"v100": 1.0}, 64: {"v100": 4.0}},
    )
    static = job("static", 1000, batch_size=32)
    policy = ShockwavePolicy(future_rounds=1, rho_max=100.0)
    assert running(policy.allocate(snapshot(growing, static))) == {"static"}


def test_the_planner_sees_whole_epochs_and_counts_the_one_in_progress_as_seen():
    # Shockwave's planner reads a job's progress as its completed epochs and its remaining run
    # time as the posterior's estimate for the epochs after the one in progress. Four epochs of
    # 250 s: at 600 s done, epochs 0-1 are completed and epoch 2 is in progress, so the log-utility
    # starts from 2/4 and 250 s (epoch 3) remain; at exactly 500 s epoch 2 has only begun (the
    # same view); in the last epoch nothing remains.
    policy = ShockwavePolicy(future_rounds=1, rho_max=100.0)
    views = {}
    for done in (500.0, 600.0, 800.0):
        snap = snapshot(job("a", 1000, done, epochs=4))
        policy._observe(snap, snap.jobs)
        problem = policy._problem(snap, snap.jobs)
        views[done] = (problem.progress[0], problem.remaining_s[0])
    assert views[500.0] == views[600.0] == (0.5, pytest.approx(250.0))
    assert views[800.0] == (0.75, 0.0)


def test_a_fair_finish_time_counts_from_the_round_the_planner_first_sees_the_job():
    # Shockwave registers a job's submission at the round boundary after its arrival. "late"
    # arrives at 50 s, mid-round, and is first seen at 100 s: alone (share 1, 1000 steps at
    # 1 step/s, 990 s after the hundredth in progress) it would finish at 100 + 990 s. A fresh
    # policy, which could not have seen it earlier, counts from its arrival.
    early = job("early", 1000)
    late = job("late", 1000, arrival_s=50.0)
    policy = ShockwavePolicy(future_rounds=1, rho_max=100.0)
    policy.allocate(snapshot(early, gpus=2))
    both = snapshot(early, late, gpus=2, now_s=100.0)
    policy._observe(both, both.jobs)
    assert policy._problem(both, both.jobs).fair_finish_s[1] == pytest.approx(1090.0)
    fresh = ShockwavePolicy(future_rounds=1, rho_max=100.0)
    fresh._observe(both, both.jobs)
    assert fresh._problem(both, both.jobs).fair_finish_s[1] == pytest.approx(1040.0)
