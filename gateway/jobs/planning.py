"""What the job scheduler's round sees and learns: the pool of GPUs lent to jobs, the policy's
snapshot of the jobs, and throughputs learned from the jobs' own progress reports.

Throughputs are learned online, per job and GPU type, from the steps a job reports and when it
reports them (or the figure the job measured itself, when it sends one): an exponentially
weighted mean over its reports, in steps/s of the whole job. A type a job never ran on is
assumed as fast as the mean of the types it did run on (1 step/s when it ran nowhere yet): an
agnostic guess that the first round on that type corrects.

GPUs of one type differ in speed (`kernelfleet.gateway.gpu_speeds`). A lease runs at its
slowest GPU's relative speed (`kernelfleet.scheduler.jobs.placement.lease_speed`), so a rate
seen on a lease is divided by that speed before it is learned: the figures are per GPU type at
speed 1.0 (a typical GPU of the type), and a lease's expected throughput is the type's figure
times its speed. A job that ran on slow GPUs is thus not taken for a slow job.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kernelfleet.gateway.jobs.records import JobRecord, JobState
from kernelfleet.scheduler.jobs.model import JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.placement import HostDevices

SMOOTHING = 0.5
"""Weight of the newest rate in the running mean."""
MIN_INTERVAL_S = 0.5
"""Reports closer together than this are folded into the next (rates from tiny intervals are
noise)."""


@dataclass
class ThroughputMeter:
    """Learns one job's steps/s on the GPU type it runs on, report by report."""

    since: float | None = None
    steps: int = 0
    learned: dict[str, float] = field(default_factory=dict)

    def started(self, steps_done: int, now: float | None = None) -> None:
        """A new run began at `steps_done` (rates never span two runs)."""
        self.since, self.steps = time.monotonic() if now is None else now, steps_done

    def report(
        self,
        gpu_type: str,
        steps_done: int,
        measured: float | None = None,
        now: float | None = None,
        speed: float = 1.0,
    ) -> float | None:
        """Fold a report in from a lease of relative `speed`; returns the type's new figure at
        speed 1.0 (None when nothing was learned)."""
        now = time.monotonic() if now is None else now
        rate = measured
        if rate is None and self.since is not None and now - self.since >= MIN_INTERVAL_S:
            if steps_done > self.steps:
                rate = (steps_done - self.steps) / (now - self.since)
            self.since, self.steps = now, steps_done
        if rate is None or rate <= 0 or speed <= 0:
            return None
        rate /= speed
        old = self.learned.get(gpu_type)
        self.learned[gpu_type] = rate if old is None else SMOOTHING * rate + (1 - SMOOTHING) * old
        return self.learned[gpu_type]


def assumed_throughputs(learned: Mapping[str, float], gpu_types: Iterable[str]) -> dict[str, float]:
    """`learned`, completed for the types never measured (see the module docstring)."""
    guess = sum(learned.values()) / len(learned) if learned else 1.0
    return {gpu_type: learned.get(gpu_type, guess) for gpu_type in gpu_types}


def job_view(job: JobRecord, gpu_types: Iterable[str], now: float) -> JobView:
    """The job as a policy sees it (`kernelfleet.scheduler.jobs.model.JobView`)."""
    ran = sum(job.time_on.values())
    return JobView(
        job_id=job.id,
        job_type=job.name,
        scale_factor=job.gpus,
        total_steps=job.steps,
        throughputs=assumed_throughputs(job.throughput, gpu_types),
        steps_done=float(job.steps_done),
        priority_weight=job.weight,
        arrival_s=job.submitted_at,
        time_on=dict(job.time_on),
        waiting_s=max(0.0, now - job.submitted_at - ran),
    )


def pool_of(hosts: Iterable[HostDevices]) -> dict[str, int]:
    """GPUs per type of the pool (the snapshot's ``cluster``), in first-seen order."""
    counts: Counter[str] = Counter()
    for host in hosts:
        counts[host.gpu_type] += len(host.devices)
    return {gpu_type: count for gpu_type, count in counts.items() if count > 0}


def snapshot_of(
    jobs: Iterable[JobRecord], cluster: Mapping[str, int], round_s: float, now: float
) -> JobsSnapshot:
    """The policy's view: the jobs that want GPUs (queued or running) over the pool."""
    wanting = [job for job in jobs if job.state in (JobState.QUEUED, JobState.RUNNING)]
    views = tuple(job_view(job, cluster, now) for job in wanting)
    return JobsSnapshot(now_s=now, cluster=dict(cluster), jobs=views, round_s=round_s)
