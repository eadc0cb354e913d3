"""Gavel's round mechanism: shares realised over many rounds, leases, deficits, multi-GPU jobs."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kernelfleet.scheduler.jobs.model import Allocation, JobLease, JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.rounds import RoundScheduler

ROUND_S = 360.0


def job(job_id: str, scale_factor: int = 1, **throughputs: float) -> JobView:
    return JobView(
        job_id=job_id,
        job_type="t",
        scale_factor=scale_factor,
        total_steps=10**9,
        throughputs=throughputs or {"g": 1.0},
    )


def run_rounds(
    scheduler: RoundScheduler,
    cluster: dict[str, int],
    jobs: list[JobView],
    allocation: Allocation,
    rounds: int,
    start_s: float = 0.0,
) -> Counter[tuple[str, str]]:
    """Plan and record ``rounds`` full rounds; how many each (job, type) ran."""
    ran: Counter[tuple[str, str]] = Counter()
    for index in range(rounds):
        state = JobsSnapshot(now_s=start_s + index * ROUND_S, cluster=cluster, jobs=tuple(jobs))
        plan = scheduler.plan(state, allocation)
        used = Counter()
        for job_id, lease in plan.leases.items():
            ran[(job_id, lease.gpu_type)] += 1
            used[lease.gpu_type] += lease.gpus
        assert all(used[gpu] <= cluster[gpu] for gpu in used)
        scheduler.record(plan, dict.fromkeys(plan.leases, ROUND_S))
    return ran


def test_two_jobs_alternate_on_one_gpu() -> None:
    ran = run_rounds(
        RoundScheduler(), {"g": 1}, [job("a"), job("b")], {"a": {"g": 0.5}, "b": {"g": 0.5}}, 10
    )
    assert ran == {("a", "g"): 5, ("b", "g"): 5}


@pytest.mark.parametrize("rounds", [40, 200])
def test_unequal_shares_are_realised_over_many_rounds(rounds: int) -> None:
    jobs = [job("a"), job("b"), job("c")]
    shares = {"a": {"g": 0.5}, "b": {"g": 0.3}, "c": {"g": 0.2}}
    ran = run_rounds(RoundScheduler(), {"g": 1}, jobs, shares, rounds)
    for job_id, share in (("a", 0.5), ("b", 0.3), ("c", 0.2)):
        assert abs(ran[(job_id, "g")] - share * rounds) <= 1


def test_shares_across_two_types_are_realised() -> None:
    jobs = [job("a", fast=2.0, slow=1.0), job("b", fast=2.0, slow=1.0)]
    shares = {"a": {"fast": 0.75, "slow": 0.25}, "b": {"fast": 0.25, "slow": 0.75}}
    ran = run_rounds(RoundScheduler(), {"fast": 1, "slow": 1}, jobs, shares, 40)
    assert ran == {("a", "fast"): 30, ("a", "slow"): 10, ("b", "fast"): 10, ("b", "slow"): 30}


def test_multi_gpu_jobs_take_all_their_gpus_of_one_type() -> None:
    scheduler = RoundScheduler()
    jobs = [job("wide", 3, fast=1.0, slow=1.0), job("narrow", 1, fast=1.0, slow=1.0)]
    state = JobsSnapshot(now_s=0.0, cluster={"fast": 2, "slow": 4}, jobs=tuple(jobs))
    plan = scheduler.plan(
        state, {"wide": {"fast": 0.5, "slow": 0.5}, "narrow": {"fast": 1.0, "slow": 0.0}}
    )
    assert plan.leases == {"wide": JobLease("slow", 3), "narrow": JobLease("fast", 1)}


def test_leases_are_kept_while_a_job_stays_on_its_type() -> None:
    scheduler = RoundScheduler()
    state = JobsSnapshot(now_s=0.0, cluster={"g": 2}, jobs=(job("a"), job("b"), job("c")))
    shares = {"a": {"g": 1.0}, "b": {"g": 0.5}, "c": {"g": 0.5}}
    first = scheduler.plan(state, shares)
    assert first.kept == frozenset()
    scheduler.record(first, dict.fromkeys(first.leases, ROUND_S))
    second = scheduler.plan(JobsSnapshot(now_s=ROUND_S, cluster={"g": 2}, jobs=state.jobs), shares)
    assert "a" in second.kept
    assert set(second.leases) - second.kept == {"b", "c"} - set(first.leases)


def test_jobs_absent_from_the_allocation_never_run_and_idle_gpus_are_filled() -> None:
    jobs = [job("owner"), job("filler"), job("stranger")]
    shares = {"owner": {"g": 1.0}, "filler": {"g": 0.0}}
    plan = RoundScheduler().plan(
        JobsSnapshot(now_s=0.0, cluster={"g": 3}, jobs=tuple(jobs)), shares
    )
    assert set(plan.leases) == {"owner", "filler"}
    strict = RoundScheduler(fill_idle=False).plan(
        JobsSnapshot(now_s=0.0, cluster={"g": 3}, jobs=tuple(jobs)), shares
    )
    assert set(strict.leases) == {"owner"}


def test_a_new_allocation_turns_missed_time_into_deficit() -> None:
    scheduler = RoundScheduler()
    jobs = (job("a"), job("b"))
    plan = scheduler.plan(
        JobsSnapshot(now_s=0.0, cluster={"g": 1}, jobs=jobs), {"a": {"g": 0.5}, "b": {"g": 0.5}}
    )
    assert set(plan.leases) == {"a"}
    scheduler.record(plan, {"a": ROUND_S})
    # After one round each was owed half of it; "a" had all of it.
    scheduler.plan(
        JobsSnapshot(now_s=ROUND_S, cluster={"g": 1}, jobs=jobs), {"a": {"g": 0.6}, "b": {"g": 0.4}}
    )
    assert scheduler.deficits["a"]["g"] == pytest.approx(-ROUND_S / 2)
    assert scheduler.deficits["b"]["g"] == pytest.approx(ROUND_S / 2)
    assert scheduler.time_since_reset["a"]["g"] == ROUND_S / 2  # counters restart at half a round


def test_a_job_preempted_mid_round_is_owed_the_rest() -> None:
    scheduler = RoundScheduler()
    jobs = [job("a"), job("b")]
    shares = {"a": {"g": 0.5}, "b": {"g": 0.5}}
    ran = Counter()
    for index in range(20):
        state = JobsSnapshot(now_s=index * ROUND_S, cluster={"g": 1}, jobs=tuple(jobs))
        plan = scheduler.plan(state, shares)
        (job_id,) = plan.leases
        seconds = ROUND_S / 4 if job_id == "a" else ROUND_S  # "a" loses its GPU to cells
        ran[job_id] += seconds
        scheduler.record(plan, {job_id: seconds})
    assert ran["a"] == pytest.approx(ran["b"], rel=0.15)


def test_forget_drops_a_finished_job() -> None:
    scheduler = RoundScheduler()
    run_rounds(scheduler, {"g": 1}, [job("a"), job("b")], {"a": {"g": 0.5}, "b": {"g": 0.5}}, 2)
    scheduler.forget("a")
    assert "a" not in scheduler.time_since_reset
    assert "a" not in scheduler.deficits
    plan = scheduler.plan(
        JobsSnapshot(now_s=720.0, cluster={"g": 1}, jobs=(job("b"),)),
        {"a": {"g": 0.5}, "b": {"g": 0.5}},
    )
    assert set(plan.leases) == {"b"}


def test_shuffled_type_order_follows_its_seed() -> None:
    jobs = [job(f"j{i}", fast=1.0, slow=1.0) for i in range(2)]
    shares = {j.job_id: {"fast": 0.5, "slow": 0.5} for j in jobs}
    first = run_rounds(
        RoundScheduler(shuffle=random.Random(7)), {"fast": 1, "slow": 1}, jobs, shares, 30
    )
    again = run_rounds(
        RoundScheduler(shuffle=random.Random(7)), {"fast": 1, "slow": 1}, jobs, shares, 30
    )
    assert first == again
    assert sum(first.values()) == 60
