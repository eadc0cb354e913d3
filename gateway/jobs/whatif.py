"""``POST /api/fleet/jobs/simulate``: the unfinished jobs, as they stand, through the job
simulator (`kernelfleet.scheduler.jobs.simulator`) under other policies: their remaining steps,
at the throughputs learned so far (`planning.assumed_throughputs`), on a given pool of GPUs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kernelfleet.gateway.jobs.planning import assumed_throughputs
from kernelfleet.gateway.jobs.records import JobRecord
from kernelfleet.scheduler.jobs.policy import JobPolicy
from kernelfleet.scheduler.jobs.simulator import SimulatedJob, StaticThroughput, simulate_jobs

NOTHING = {
    "avg_jct_s": 0.0,
    "makespan_s": 0.0,
    "utilisation": 0.0,
    "jobs": 0,
    "ftf_rho": {"median": 0.0, "p75": 0.0, "max": 0.0, "unfair_share": 0.0},
}
"""The figures of an empty queue (or of a fleet without GPUs)."""


def what_if(
    jobs: Iterable[JobRecord],
    cluster: Mapping[str, int],
    policies: Iterable[JobPolicy],
    round_s: float,
    fallback: JobPolicy,
) -> dict[str, dict[str, Any]]:
    """Each policy's figures (the JSON interface of ``kernelfleet simulate-jobs``). Blocking:
    the policies' solvers run here, so call it from a worker thread."""
    simulated = [
        SimulatedJob(
            job_id=job.id,
            job_type=job.name,
            scale_factor=job.gpus,
            total_steps=max(1, job.steps - job.steps_done),
            arrival_s=0.0,
            model=StaticThroughput(assumed_throughputs(job.throughput, cluster)),
            priority_weight=job.weight,
        )
        for job in jobs
        if not job.state.finished
    ]
    if not simulated or not cluster:
        return {policy.name: dict(NOTHING) for policy in policies}
    return {
        policy.name: simulate_jobs(
            simulated, cluster, policy, round_s=round_s, fallback=fallback
        ).as_document()
        for policy in policies
    }
