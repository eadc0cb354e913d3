"""Gavel's policies on problems small enough to solve by hand."""

from __future__ import annotations

import pytest

from kernelfleet.scheduler.jobs import gavel
from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.policy import SolverFailed, decide

ALL = [
    gavel.FifoPolicy,
    gavel.FifoPerfPolicy,
    gavel.MaxMinFairnessPolicy,
    gavel.MaxMinFairnessPerfPolicy,
    gavel.FinishTimeFairnessPolicy,
    gavel.FinishTimeFairnessPerfPolicy,
    gavel.MinTotalDurationPolicy,
    gavel.MinTotalDurationPerfPolicy,
]


def job(job_id: str, throughputs: dict[str, float], **fields: object) -> JobView:
    values: dict = {"job_type": "t", "scale_factor": 1, "total_steps": 1000} | fields
    return JobView(job_id=job_id, throughputs=throughputs, **values)


def snapshot(cluster: dict[str, int], *jobs: JobView, now_s: float = 0.0) -> JobsSnapshot:
    return JobsSnapshot(now_s=now_s, cluster=cluster, jobs=tuple(jobs))


def effective(allocation: Allocation, view: JobView) -> float:
    return sum(
        share * view.throughputs.get(gpu, 0.0) for gpu, share in allocation[view.job_id].items()
    )


def assert_feasible(allocation: Allocation, state: JobsSnapshot) -> None:
    for gpu, count in state.cluster.items():
        used = sum(allocation.get(j.job_id, {}).get(gpu, 0.0) * j.scale_factor for j in state.jobs)
        assert used <= count + 1e-6
    for shares in allocation.values():
        assert sum(shares.values()) <= 1 + 1e-6
        assert min(shares.values()) >= 0


@pytest.mark.parametrize("policy_class", ALL)
def test_every_policy_is_named_and_built_without_arguments(policy_class: type) -> None:
    policy = policy_class()
    assert policy.name == policy_class.name
    assert policy.name.endswith("_perf") == policy.heterogeneity_aware
    assert policy.allocate(snapshot({"v100": 2})) == {}


def test_heterogeneity_aware_max_min_fairness_by_hand() -> None:
    # A is 4x faster on the fast GPU, B 2x. Proportional shares give A 2.5 and B 1.5 steps/s;
    # equalising the normalised throughputs puts half of each GPU on each job: A 2.5, B 1.5.
    a = job("a", {"fast": 4.0, "slow": 1.0})
    b = job("b", {"fast": 2.0, "slow": 1.0})
    state = snapshot({"fast": 1, "slow": 1}, a, b)
    allocation = gavel.MaxMinFairnessPerfPolicy().allocate(state)
    assert_feasible(allocation, state)
    assert effective(allocation, a) == pytest.approx(2.5, abs=1e-4)
    assert effective(allocation, b) == pytest.approx(1.5, abs=1e-4)


def test_agnostic_max_min_fairness_gives_equal_gpu_time() -> None:
    a = job("a", {"fast": 4.0, "slow": 1.0})
    b = job("b", {"fast": 2.0, "slow": 1.0})
    allocation = gavel.MaxMinFairnessPolicy().allocate(snapshot({"fast": 1, "slow": 1}, a, b))
    assert sum(allocation["a"].values()) == pytest.approx(1.0)
    assert sum(allocation["b"].values()) == pytest.approx(1.0)


def test_max_min_fairness_weights_and_scale_factors() -> None:
    light, heavy = job("light", {"g": 1.0}), job("heavy", {"g": 1.0}, priority_weight=3.0)
    allocation = gavel.MaxMinFairnessPolicy().allocate(snapshot({"g": 1}, light, heavy))
    assert allocation["light"]["g"] == pytest.approx(0.25, abs=1e-6)
    assert allocation["heavy"]["g"] == pytest.approx(0.75, abs=1e-6)
    # A 2-GPU job needs half the time of a 1-GPU job for as much GPU time.
    wide, narrow = job("wide", {"g": 1.0}, scale_factor=2), job("narrow", {"g": 1.0})
    allocation = gavel.MaxMinFairnessPolicy().allocate(snapshot({"g": 2}, wide, narrow))
    assert allocation["wide"]["g"] == pytest.approx(0.5, abs=1e-6)
    assert allocation["narrow"]["g"] == pytest.approx(1.0, abs=1e-6)


def test_jobs_get_no_time_where_they_cannot_run() -> None:
    picky = job("picky", {"fast": 0.0, "slow": 1.0})
    wide = job("wide", {"fast": 5.0, "slow": 5.0}, scale_factor=4)
    stranded = job("stranded", {"fast": 0.0, "slow": 0.0})
    state = snapshot({"fast": 4, "slow": 2}, picky, wide, stranded)
    for policy in (gavel.MaxMinFairnessPolicy(), gavel.MaxMinFairnessPerfPolicy()):
        allocation = policy.allocate(state)
        assert allocation["picky"]["fast"] == 0.0
        assert allocation["wide"]["slow"] == 0.0
        assert allocation["stranded"] == {"fast": 0.0, "slow": 0.0}


def test_min_total_duration_finds_the_makespan_within_five_percent() -> None:
    # One GPU, 100 and 300 steps at 1 step/s: everything is done after 400 s at best.
    short, long = (
        job("short", {"g": 1.0}, total_steps=100),
        job("long", {"g": 1.0}, total_steps=300),
    )
    allocation = gavel.MinTotalDurationPerfPolicy().allocate(snapshot({"g": 1}, short, long))
    makespan = max(100 / allocation["short"]["g"], 300 / allocation["long"]["g"])
    assert 400 <= makespan <= 400 * 1.05


def test_heterogeneity_aware_makespan_beats_the_agnostic_one() -> None:
    # A needs the fast GPU (4x); B is indifferent. Aware: A on fast, B on slow, 100 s.
    a = job("a", {"fast": 4.0, "slow": 1.0}, total_steps=400)
    b = job("b", {"fast": 1.0, "slow": 1.0}, total_steps=100)
    state = snapshot({"fast": 1, "slow": 1}, a, b)
    aware = gavel.MinTotalDurationPerfPolicy().allocate(state)
    assert max(400 / effective(aware, a), 100 / effective(aware, b)) <= 105
    agnostic = gavel.MinTotalDurationPolicy(reference_gpu_type="fast").allocate(state)
    assert_feasible(agnostic, state)
    assert max(400 / effective(agnostic, a), 100 / effective(agnostic, b)) > 105


def test_finish_time_fairness_splits_one_gpu_between_equal_jobs() -> None:
    a, b = job("a", {"g": 2.0}), job("b", {"g": 2.0})
    for policy in (gavel.FinishTimeFairnessPerfPolicy(), gavel.FinishTimeFairnessPolicy()):
        allocation = policy.allocate(snapshot({"g": 1}, a, b))
        assert allocation["a"]["g"] == pytest.approx(0.5, abs=0.01)
        assert allocation["b"]["g"] == pytest.approx(0.5, abs=0.01)


def test_finish_time_fairness_favours_the_job_that_waited() -> None:
    # Both arrived at 0 with 1000 steps; at 1000 s "late" has done nothing, "early" half.
    early = job("early", {"g": 1.0}, steps_done=500.0)
    late = job("late", {"g": 1.0})
    allocation = gavel.FinishTimeFairnessPerfPolicy().allocate(
        snapshot({"g": 1}, early, late, now_s=1000.0)
    )
    assert allocation["late"]["g"] > allocation["early"]["g"]


def test_fifo_runs_in_arrival_order_and_blocks_at_the_head() -> None:
    first = job("first", {"fast": 2.0, "slow": 1.0}, arrival_s=0.0)
    wide = job("wide", {"fast": 2.0, "slow": 1.0}, arrival_s=1.0, scale_factor=2)
    after = job("after", {"fast": 2.0, "slow": 1.0}, arrival_s=2.0)
    state = snapshot({"fast": 1, "slow": 1}, after, wide, first)
    allocation = gavel.FifoPerfPolicy().allocate(state)
    assert allocation == {"first": {"fast": 1.0, "slow": 0.0}}


def test_fifo_keeps_a_started_job_on_its_type() -> None:
    started = job("started", {"fast": 2.0, "slow": 1.0}, arrival_s=1.0, time_on={"slow": 360.0})
    fresh = job("fresh", {"fast": 2.0, "slow": 1.0}, arrival_s=0.0)
    allocation = gavel.FifoPerfPolicy().allocate(snapshot({"fast": 1, "slow": 1}, fresh, started))
    assert allocation == {
        "started": {"fast": 0.0, "slow": 1.0},
        "fresh": {"fast": 1.0, "slow": 0.0},
    }


def test_agnostic_fifo_draws_the_type_from_its_seed() -> None:
    jobs = [job(f"j{i}", {"a": 1.0, "b": 1.0, "c": 1.0}, arrival_s=float(i)) for i in range(3)]
    state = snapshot({"a": 1, "b": 1, "c": 1}, *jobs)
    draws = {
        tuple(
            sorted(
                g
                for s in gavel.FifoPolicy(seed=seed).allocate(state).values()
                for g, v in s.items()
                if v
            )
        )
        for seed in range(10)
    }
    assert draws == {("a", "b", "c")}
    assert gavel.FifoPolicy(seed=3).allocate(state) == gavel.FifoPolicy(seed=3).allocate(state)


def test_solver_failure_raises_and_the_fallback_runs() -> None:
    a = job("a", {"g": 1.0})
    state = snapshot({"g": 1}, a)
    broken = gavel.MinTotalDurationPolicy(reference_gpu_type="tpu")
    with pytest.raises(SolverFailed, match="reference GPU type 'tpu'"):
        broken.allocate(state)
    decision = decide(broken, gavel.FifoPerfPolicy(), state)
    assert decision.policy == "fifo_perf"
    assert decision.fallback_reason is not None
    assert "tpu" in decision.fallback_reason
    assert decision.allocation == {"a": {"g": 1.0}}


def test_an_infeasible_makespan_is_a_solver_failure() -> None:
    # 10^9 steps at 10^-9 steps/s: beyond every window the bisection tries.
    huge = job("huge", {"g": 1e-9}, total_steps=10**9)
    with pytest.raises(SolverFailed, match="no makespan up to"):
        gavel.MinTotalDurationPerfPolicy().allocate(snapshot({"g": 1}, huge))


@pytest.mark.benchmark
def test_solve_time_per_allocation_vs_jobs() -> None:
    """Prints each ``_perf`` policy's wall time for one allocation of n jobs (a quarter of n GPUs
    of each of three types, throughputs drawn from three speed profiles)."""
    import random
    import time

    profiles = [(3.0, 2.0, 1.0), (2.0, 1.8, 1.0), (4.0, 1.5, 0.5)]
    draw = random.Random(0)
    print("\njobs  " + "  ".join(f"{p.name:>26}" for p in PERF_POLICIES))
    for n in (32, 128, 256, 512):
        jobs = [
            job(
                f"j{i}",
                dict(zip(("v100", "p100", "k80"), draw.choice(profiles), strict=True)),
                scale_factor=draw.choice((1, 1, 1, 2, 4)),
                total_steps=draw.randrange(10_000, 1_000_000),
            )
            for i in range(n)
        ]
        state = snapshot({"v100": n // 4, "p100": n // 4, "k80": n // 4}, *jobs)
        timings = []
        for policy_class in PERF_POLICIES:
            started = time.perf_counter()
            allocation = policy_class().allocate(state)
            timings.append(time.perf_counter() - started)
            assert_feasible(allocation, state)
        print(f"{n:>4}  " + "  ".join(f"{seconds:>25.3f}s" for seconds in timings))


PERF_POLICIES = [
    gavel.MaxMinFairnessPerfPolicy,
    gavel.FinishTimeFairnessPerfPolicy,
    gavel.MinTotalDurationPerfPolicy,
]
