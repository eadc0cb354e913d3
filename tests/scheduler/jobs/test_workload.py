"""The synthetic job stream: seeded, within its span, with Gavel's size and duration laws."""

from __future__ import annotations

import math

import pytest

from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.workload import job_stream

TABLE = ThroughputTable.from_document(
    {
        "v100": {
            "('A (batch size 32)', 1)": {"null": 10.0},
            "('A (batch size 32)', 2)": {"null": 18.0},
            "('A (batch size 32)', 4)": {"null": 30.0},
            "('B (batch size 8)', 1)": {"null": 2.0},
            "('B (batch size 8)', 8)": {"null": 12.0},
        },
        "k80": {
            "('A (batch size 32)', 1)": {"null": 3.0},
            "('B (batch size 8)', 1)": {"null": 0.5},
        },
    }
)


def test_the_same_seed_gives_the_same_jobs_and_another_seed_others() -> None:
    one = job_stream(TABLE, ["v100"], jobs_per_hour=10, span_s=36_000, seed=3)
    again = job_stream(TABLE, ["v100"], jobs_per_hour=10, span_s=36_000, seed=3)
    other = job_stream(TABLE, ["v100"], jobs_per_hour=10, span_s=36_000, seed=4)
    assert [(j.job_type, j.total_steps, j.arrival_s) for j in one] == [
        (j.job_type, j.total_steps, j.arrival_s) for j in again
    ]
    assert [j.arrival_s for j in one] != [j.arrival_s for j in other]


def test_jobs_arrive_within_the_span_at_about_the_rate_asked() -> None:
    jobs = job_stream(TABLE, ["v100"], jobs_per_hour=20, span_s=100 * 3600, start_s=500.0)
    assert all(500.0 <= job.arrival_s < 500.0 + 100 * 3600 for job in jobs)
    assert len(jobs) == pytest.approx(2000, rel=0.1)


def test_sizes_follow_philly_and_durations_gavel_s_law() -> None:
    jobs = job_stream(TABLE, ["v100"], jobs_per_hour=50, span_s=100 * 3600, seed=1)
    share = {g: sum(j.scale_factor == g for j in jobs) / len(jobs) for g in (1, 2, 4, 8)}
    assert share[1] == pytest.approx(0.70, abs=0.04)
    assert share[2] == pytest.approx(0.10, abs=0.03)
    assert share[4] == pytest.approx(0.15, abs=0.03)
    assert share[8] == pytest.approx(0.05, abs=0.02)
    for job in jobs:
        minutes = job.total_steps / job.model.steps_per_s("v100", 0.0) / 60
        assert 10**1.5 - 1 <= minutes <= 10**4 + 1
    long_share = sum(
        j.total_steps / j.model.steps_per_s("v100", 0.0) > 1000 * 60 for j in jobs
    ) / len(jobs)
    assert long_share == pytest.approx(0.2, abs=0.04)


def test_only_job_types_every_gpu_type_can_run_are_drawn() -> None:
    jobs = job_stream(TABLE, ["v100", "k80"], jobs_per_hour=50, span_s=20 * 3600, seed=2)
    assert jobs
    assert {job.scale_factor for job in jobs} == {1}  # k80 has only single-GPU entries
    assert all(math.isfinite(job.model.steps_per_s("k80", 0.0)) for job in jobs)
    assert job_stream(TABLE, ["v100"], jobs_per_hour=0, span_s=3600) == []
