"""A synthetic stream of training jobs, drawn the way Gavel's own evaluation draws them.

Each job is one of the throughput table's job types (uniformly), with a GPU count from the
Philly trace's distribution (70 % one GPU, 10 % two, 15 % four, 5 % eight), a duration alone on
its GPUs of the first type given of ``10**x`` minutes, ``x`` uniform in [1.5, 3] for 80 % of jobs
and in [3, 4] for the rest, turned into a step count with the table's throughput, and Poisson
arrivals. Seeded: the same arguments give the same jobs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kernelfleet.scheduler.jobs.simulator import SimulatedJob, StaticThroughput
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable

SCALE_FACTORS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
"""GPU counts and their probabilities (Microsoft's Philly trace, as Gavel uses it)."""


def job_stream(
    table: ThroughputTable,
    gpu_types: Sequence[str],
    jobs_per_hour: float,
    span_s: float,
    seed: int = 0,
    max_gpus: int = 8,
    start_s: float = 0.0,
) -> list[SimulatedJob]:
    """Jobs arriving in ``[start_s, start_s + span_s)`` at ``jobs_per_hour`` on average.

    A job type is drawn among those the table has at the drawn GPU count on every one of
    ``gpu_types``; GPU counts above ``max_gpus`` are not drawn.
    """
    if jobs_per_hour <= 0 or span_s <= 0:
        return []
    rng = random.Random(seed)
    scales = [(gpus, weight) for gpus, weight in SCALE_FACTORS if gpus <= max_gpus]
    candidates = {
        gpus: sorted(
            job_type
            for job_type, scale in table.job_types()
            if scale == gpus
            and all(table.isolated_by_gpu[gpu].get((job_type, gpus), 0.0) > 0 for gpu in gpu_types)
        )
        for gpus, _ in scales
    }
    scales = [(gpus, weight) for gpus, weight in scales if candidates[gpus]]
    if not scales:
        return []
    jobs: list[SimulatedJob] = []
    now = start_s
    while True:
        now += rng.expovariate(jobs_per_hour / 3600.0)
        if now >= start_s + span_s:
            return jobs
        gpus = rng.choices([g for g, _ in scales], weights=[w for _, w in scales])[0]
        job_type = rng.choice(candidates[gpus])
        exponent = rng.uniform(1.5, 3.0) if rng.random() < 0.8 else rng.uniform(3.0, 4.0)
        minutes = 10.0**exponent
        throughputs = table.throughputs_for(job_type, gpus, gpu_types)
        reference = throughputs[gpu_types[0]]
        jobs.append(
            SimulatedJob(
                job_id=f"job-{len(jobs)}",
                job_type=job_type,
                scale_factor=gpus,
                total_steps=max(1, round(minutes * 60 * reference)),
                arrival_s=now,
                model=StaticThroughput(throughputs),
            )
        )
