"""What the job schedulers decide on and what they answer: frozen views, no I/O.

A *job* is a background training run that needs ``scale_factor`` GPUs of one type at a time and
``total_steps`` steps in all. A policy (`kernelfleet.scheduler.jobs.policy.JobPolicy`) turns a
`JobsSnapshot` into an `Allocation`: for every job, the share of time it should spend on each GPU
type (Gavel's ``X`` matrix). The round mechanism (`kernelfleet.scheduler.jobs.rounds`) turns an
allocation into the concrete `RoundPlan` of the next round. The simulator and the live gateway
call the very same code.

Times are seconds on the caller's clock; throughputs are steps per second of the whole job (all
its ``scale_factor`` GPUs together) on one GPU type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Allocation = Mapping[str, Mapping[str, float]]
"""job id -> GPU type -> share of time in [0, 1]; a job's shares sum to at most 1."""


@dataclass(frozen=True)
class JobView:
    """One job as a policy sees it.

    ``throughputs`` has the job's steps/s on every GPU type it can run on (measured online for
    live jobs, from the throughput table in simulation); a type missing from it, or with 0, is
    one the job cannot use. ``time_on`` is the wall time the job has run so far per GPU type;
    ``waiting_s`` the time since its arrival that it ran on nothing.
    ``mode`` and ``batch_size`` describe a job whose batch size changes as it trains (Shockwave's
    ``gns`` and ``accordion`` jobs); ``static`` jobs keep theirs. For such a job, ``epochs`` is how
    many epochs its step budget spans (0: unknown) and ``regime_throughputs`` its throughputs (in
    the units of ``throughputs``) at every batch size it may reach, so Shockwave can predict its
    remaining time; both stay empty for a job that cannot say.
    """

    job_id: str
    job_type: str
    scale_factor: int
    total_steps: int
    throughputs: Mapping[str, float]
    steps_done: float = 0.0
    priority_weight: float = 1.0
    arrival_s: float = 0.0
    time_on: Mapping[str, float] = field(default_factory=dict)
    waiting_s: float = 0.0
    mode: str = "static"
    batch_size: int | None = None
    epochs: int = 0
    regime_throughputs: Mapping[int, Mapping[str, float]] = field(default_factory=dict)

    @property
    def steps_left(self) -> float:
        return max(self.total_steps - self.steps_done, 0.0)

    def can_run_on(self, gpu_type: str) -> bool:
        return self.throughputs.get(gpu_type, 0.0) > 0.0


@dataclass(frozen=True)
class JobsSnapshot:
    """The jobs to schedule and the GPUs they may share, at time ``now_s``.

    ``cluster`` counts, per GPU type, the GPUs lent to jobs (those cells do not hold); its order is
    the order policies break ties in. ``round_s`` is the length of a scheduling round.
    """

    now_s: float
    cluster: Mapping[str, int]
    jobs: tuple[JobView, ...]
    round_s: float = 360.0

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.cluster)

    def job(self, job_id: str) -> JobView:
        for job in self.jobs:
            if job.job_id == job_id:
                return job
        raise KeyError(job_id)


@dataclass(frozen=True)
class JobLease:
    """The GPUs one job runs on during a round: ``gpus`` GPUs of type ``gpu_type``."""

    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class RoundPlan:
    """Which jobs run in the next round and on what; a job absent from ``leases`` waits.

    ``kept`` names the jobs whose lease continues from the previous round unchanged (Gavel's
    lease extension: their processes are not stopped and restarted).
    """

    leases: Mapping[str, JobLease]
    kept: frozenset[str] = frozenset()
