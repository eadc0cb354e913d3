"""The job simulator: a job trace through a `JobPolicy` and the round mechanism, on a simulated
heterogeneous cluster, with the metrics Gavel and Shockwave report.

It follows Gavel's simulator: time advances round by round; at the start of a round the jobs that
have arrived join, the allocation is recomputed if needed, and `RoundScheduler` picks the jobs
that run. A job runs the whole round on its lease unless it finishes first: it finishes at the
exact moment its last step is done (its completion time is that moment), and its GPUs stay idle
until the round ends; a round where every job finishes early ends with the last of them.
The allocation is recomputed when the set of jobs has changed and at least
``reallocation_interval_s`` has passed since the last one (Gavel: 1920 s), at once when nothing
could run, and every round for a policy with ``replans_every_round``.

Each job carries a `ThroughputModel` (steps/s on a GPU type given the steps done, and its batch
size), so jobs whose throughput changes as they train (Shockwave's dynamic batch sizes) plug in
without touching this module; `StaticThroughput` is the throughput table's isolated figure.

Metrics (`JobsRunResult`): average JCT (completion minus arrival), makespan (last completion
minus first arrival), utilisation (GPU-seconds the jobs ran over GPUs x makespan) and Shockwave's
finish-time fairness ``rho = JCT / (t_alone * max(1, jobs / GPUs))``, ``t_alone`` the time the job
takes alone on its fastest GPU type; ``unfair_share`` is the fraction of jobs with ``rho`` over
1.05 (Shockwave's threshold).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot, JobView, RoundPlan
from kernelfleet.scheduler.jobs.policy import JobPolicy, decide
from kernelfleet.scheduler.jobs.rounds import RoundScheduler
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.traces import TraceJob

GAVEL_REALLOCATION_INTERVAL_S = 1920.0
UNFAIR_RHO = 1.05
SUBSTEPS_PER_ROUND = 12
"""How finely a job whose throughput varies is integrated within a round."""


class ThroughputModel(Protocol):
    """How fast a simulated job trains: steps/s of the whole job on ``gpu_type`` once it has done
    ``steps_done`` steps (0 where it cannot run), and its batch size then (None if unknown)."""

    def steps_per_s(self, gpu_type: str, steps_done: float) -> float: ...

    def batch_size(self, steps_done: float) -> int | None: ...


@dataclass(frozen=True)
class StaticThroughput:
    """A job whose throughput never changes (the throughput table's isolated figure)."""

    throughputs: Mapping[str, float]
    initial_batch_size: int | None = None

    def steps_per_s(self, gpu_type: str, steps_done: float) -> float:
        return self.throughputs.get(gpu_type, 0.0)

    def batch_size(self, steps_done: float) -> int | None:
        return self.initial_batch_size


@dataclass(frozen=True)
class SimulatedJob:
    job_id: str
    job_type: str
    scale_factor: int
    total_steps: int
    arrival_s: float
    model: ThroughputModel
    priority_weight: float = 1.0
    mode: str = "static"


class SimulationError(InvalidRequest):
    """The jobs cannot be simulated on this cluster (a job that can never run, say)."""

    reason = "invalid-simulation"


_BATCH_SIZE = re.compile(r"\(batch size (\d+)\)")


def jobs_from_trace(
    trace: Iterable[TraceJob], table: ThroughputTable, gpu_types: Iterable[str]
) -> list[SimulatedJob]:
    """Static simulated jobs ``job-<line>`` from trace lines, throughputs from ``table``."""
    types = list(gpu_types)
    jobs = []
    for entry in trace:
        match = _BATCH_SIZE.search(entry.job_type)
        throughputs = table.throughputs_for(entry.job_type, entry.scale_factor, types)
        jobs.append(
            SimulatedJob(
                job_id=f"job-{entry.line}",
                job_type=entry.job_type,
                scale_factor=entry.scale_factor,
                total_steps=entry.total_steps,
                arrival_s=entry.arrival_s,
                model=StaticThroughput(throughputs, int(match.group(1)) if match else None),
                priority_weight=entry.priority_weight,
                mode=entry.mode,
            )
        )
    return jobs


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    arrival_s: float
    finish_s: float
    alone_s: float
    rho: float

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s


@dataclass(frozen=True)
class FtfRho:
    median: float
    p75: float
    max: float
    unfair_share: float


@dataclass(frozen=True)
class JobsRunResult:
    """One policy's run; `as_document` is its entry in the JSON interface."""

    policy: str
    avg_jct_s: float
    makespan_s: float
    utilisation: float
    ftf_rho: FtfRho
    jobs: int
    outcomes: tuple[JobOutcome, ...] = ()
    busy_history: tuple[tuple[float, int], ...] = ()
    """(time, GPUs busy) at each round start."""
    rounds: int = 0
    allocations: int = 0
    solver_s: float = 0.0
    fallbacks: tuple[str, ...] = ()

    def as_document(self) -> dict[str, Any]:
        return {
            "avg_jct_s": self.avg_jct_s,
            "makespan_s": self.makespan_s,
            "utilisation": self.utilisation,
            "ftf_rho": {
                "median": self.ftf_rho.median,
                "p75": self.ftf_rho.p75,
                "max": self.ftf_rho.max,
                "unfair_share": self.ftf_rho.unfair_share,
            },
            "jobs": self.jobs,
        }


@dataclass
class _Running:
    """A job's mutable state in the simulation."""

    job: SimulatedJob
    steps_done: float = 0.0
    time_on: dict[str, float] = field(default_factory=dict)
    finish_s: float | None = None

    def view(self, now_s: float, gpu_types: Sequence[str]) -> JobView:
        job = self.job
        ran = sum(self.time_on.values())
        return JobView(
            job_id=job.job_id,
            job_type=job.job_type,
            scale_factor=job.scale_factor,
            total_steps=job.total_steps,
            throughputs={gpu: job.model.steps_per_s(gpu, self.steps_done) for gpu in gpu_types},
            steps_done=self.steps_done,
            priority_weight=job.priority_weight,
            arrival_s=job.arrival_s,
            time_on=dict(self.time_on),
            waiting_s=max(now_s - job.arrival_s - ran, 0.0),
            mode=job.mode,
            batch_size=job.model.batch_size(self.steps_done),
        )

    def run(self, gpu_type: str, start_s: float, seconds: float) -> float:
        """Train on ``gpu_type`` for up to ``seconds``; the seconds it really ran."""
        job = self.job
        spent = 0.0
        substep = (
            seconds if isinstance(job.model, StaticThroughput) else seconds / SUBSTEPS_PER_ROUND
        )
        while spent < seconds and self.steps_done < job.total_steps:
            rate = job.model.steps_per_s(gpu_type, self.steps_done)
            if rate <= 0:
                break
            chunk = min(substep, seconds - spent)
            left = job.total_steps - self.steps_done
            if rate * chunk >= left:
                spent += left / rate
                self.steps_done = float(job.total_steps)
                self.finish_s = start_s + spent
                break
            self.steps_done += rate * chunk
            spent += chunk
        self.time_on[gpu_type] = self.time_on.get(gpu_type, 0.0) + spent
        return spent


def simulate_jobs(
    jobs: Iterable[SimulatedJob],
    cluster: Mapping[str, int],
    policy: JobPolicy,
    round_s: float = 360.0,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    *,
    fallback: JobPolicy | None = None,
    reallocation_interval_s: float = GAVEL_REALLOCATION_INTERVAL_S,
) -> JobsRunResult:
    """Run ``jobs`` through ``policy`` on ``cluster`` (GPU type -> count) in rounds of
    ``round_s`` seconds. ``seed`` drives the mechanism's random choices; ``progress`` gets the
    fraction of jobs done after each round. When the policy's solver fails, ``fallback``'s
    allocation is used (the reason is in `JobsRunResult.fallbacks`); without one the
    `SolverFailed` propagates. `SimulationError` for a job that could never run."""
    if round_s <= 0:
        raise SimulationError(f"round length must be positive, got {round_s:g} s")
    cluster = {gpu: count for gpu, count in cluster.items() if count > 0}
    if not cluster:
        raise SimulationError("the cluster has no GPUs")
    pending = sorted(jobs, key=lambda job: job.arrival_s)
    _check_runnable(pending, cluster)
    run = _Simulation(cluster, policy, fallback, round_s, seed, reallocation_interval_s)
    return run.through(pending, progress)


class _Simulation:
    """One policy's run: the clock, the jobs in flight, the allocation and the tallies."""

    def __init__(
        self,
        cluster: dict[str, int],
        policy: JobPolicy,
        fallback: JobPolicy | None,
        round_s: float,
        seed: int,
        reallocation_interval_s: float,
    ) -> None:
        self.cluster = cluster
        self.gpu_types = tuple(cluster)
        self.policy = policy
        self.fallback = fallback
        self.round_s = round_s
        self.reallocation_interval_s = reallocation_interval_s
        aware = getattr(policy, "heterogeneity_aware", True)
        self.rounds = RoundScheduler(
            shuffle=None if aware else random.Random(seed + 5),
            fill_idle=getattr(policy, "fills_idle_gpus", True),
        )
        self.active: dict[str, _Running] = {}
        self.finished: list[_Running] = []
        self.now = 0.0
        self.allocation: Allocation | None = None
        self.allocated_at = -math.inf
        self.jobs_changed = True
        self.busy_gpu_s = 0.0
        self.busy_history: list[tuple[float, int]] = []
        self.fallbacks: list[str] = []
        self.solver_s = 0.0
        self.allocations = 0
        self.round_count = 0

    def through(
        self, pending: list[SimulatedJob], progress: Callable[[float], None] | None
    ) -> JobsRunResult:
        queue = list(reversed(pending))  # next arrival last
        self.now = start = pending[0].arrival_s if pending else 0.0
        while queue or self.active:
            while queue and queue[-1].arrival_s <= self.now:
                job = queue.pop()
                self.active[job.job_id] = _Running(job)
                self.jobs_changed = True
            if not self.active:
                self.now = queue[-1].arrival_s
                continue
            plan = self.plan_round()
            if not plan.leases:
                if not queue:
                    raise SimulationError(
                        f"{self.policy.name}: at {self.now:.0f} s no job can run and none will "
                        f"arrive ({len(self.active)} waiting)"
                    )
                self.now = max(queue[-1].arrival_s, self.now)
                continue
            self.run_round(plan, start)
            if progress is not None:
                progress(len(self.finished) / len(pending))
        return self.result(start)

    def snapshot(self) -> JobsSnapshot:
        views = tuple(state.view(self.now, self.gpu_types) for state in self.active.values())
        return JobsSnapshot(self.now, self.cluster, views, self.round_s)

    def plan_round(self) -> RoundPlan:
        """Reallocate if due (or if nothing could run on a stale allocation), then plan."""
        snapshot = self.snapshot()
        due = self.jobs_changed and self.now - self.allocated_at >= self.reallocation_interval_s
        if self.allocation is None or due or self.policy.replans_every_round:
            self.allocation = self.reallocate(snapshot)
        plan = self.rounds.plan(snapshot, self.allocation)
        if not plan.leases and self.jobs_changed:
            self.allocation = self.reallocate(snapshot)
            plan = self.rounds.plan(snapshot, self.allocation)
        return plan

    def reallocate(self, snapshot: JobsSnapshot) -> Allocation:
        began = time.perf_counter()
        if self.fallback is None:
            allocation = self.policy.allocate(snapshot)
        else:
            decision = decide(self.policy, self.fallback, snapshot)
            if decision.fallback_reason is not None:
                self.fallbacks.append(f"t={snapshot.now_s:.0f}s: {decision.fallback_reason}")
            allocation = decision.allocation
        self.solver_s += time.perf_counter() - began
        self.allocations += 1
        self.allocated_at, self.jobs_changed = self.now, False
        return allocation

    def run_round(self, plan: RoundPlan, start: float) -> None:
        """Run the planned jobs; the round ends after ``round_s`` or when the last one
        finishes, if all do."""
        ran = {
            job_id: self.active[job_id].run(lease.gpu_type, self.now, self.round_s)
            for job_id, lease in plan.leases.items()
        }
        busy = sum(lease.gpus for lease in plan.leases.values())
        self.busy_history.append((self.now - start, busy))
        self.busy_gpu_s += sum(ran[job] * lease.gpus for job, lease in plan.leases.items())
        self.rounds.record(plan, ran)
        self.round_count += 1
        self.now += max(ran.values(), default=0.0) or self.round_s
        for job_id in [job for job, state in self.active.items() if state.finish_s is not None]:
            self.finished.append(self.active.pop(job_id))
            self.rounds.forget(job_id)
            self.jobs_changed = True

    def result(self, start: float) -> JobsRunResult:
        contention = max(1.0, len(self.finished) / sum(self.cluster.values()))
        outcomes = []
        for state in self.finished:
            assert state.finish_s is not None
            alone = alone_s(state.job, self.gpu_types)
            jct = state.finish_s - state.job.arrival_s
            outcomes.append(
                JobOutcome(
                    state.job.job_id,
                    state.job.arrival_s,
                    state.finish_s,
                    alone,
                    jct / (alone * contention),
                )
            )
        return summarise(
            self.policy.name,
            outcomes,
            start,
            sum(self.cluster.values()),
            self.busy_gpu_s,
            busy_history=tuple(self.busy_history),
            rounds=self.round_count,
            allocations=self.allocations,
            solver_s=self.solver_s,
            fallbacks=tuple(self.fallbacks),
        )


def _check_runnable(jobs: Sequence[SimulatedJob], cluster: Mapping[str, int]) -> None:
    for job in jobs:
        if not any(
            count >= job.scale_factor and job.model.steps_per_s(gpu, 0.0) > 0
            for gpu, count in cluster.items()
        ):
            raise SimulationError(
                f"job {job.job_id} ({job.job_type}, {job.scale_factor} GPU(s)) can run on no "
                f"GPU type of the cluster {dict(cluster)}"
            )


def alone_s(job: SimulatedJob, gpu_types: Sequence[str]) -> float:
    """Seconds the job takes alone on its fastest GPU type (integrated if its rate varies)."""
    best = max(gpu_types, key=lambda gpu: job.model.steps_per_s(gpu, 0.0))
    if isinstance(job.model, StaticThroughput):
        return job.total_steps / job.model.steps_per_s(best, 0.0)
    pieces = 200
    width = job.total_steps / pieces
    seconds = 0.0
    for piece in range(pieces):
        rate = job.model.steps_per_s(best, (piece + 0.5) * width)
        seconds += width / rate if rate > 0 else math.inf
    return seconds


def summarise(
    name: str,
    outcomes: Sequence[JobOutcome],
    start: float,
    total_gpus: int,
    busy_gpu_s: float,
    **details: Any,
) -> JobsRunResult:
    """The metrics of the JSON interface from the jobs' outcomes."""
    if not outcomes:
        return JobsRunResult(name, 0.0, 0.0, 0.0, FtfRho(0.0, 0.0, 0.0, 0.0), 0, **details)
    makespan = max(outcome.finish_s for outcome in outcomes) - start
    rhos = np.array([outcome.rho for outcome in outcomes])
    return JobsRunResult(
        policy=name,
        avg_jct_s=float(np.mean([outcome.jct_s for outcome in outcomes])),
        makespan_s=makespan,
        utilisation=busy_gpu_s / (total_gpus * makespan) if makespan > 0 else 0.0,
        ftf_rho=FtfRho(
            median=float(np.median(rhos)),
            p75=float(np.percentile(rhos, 75)),
            max=float(rhos.max()),
            unfair_share=float(np.mean(rhos > UNFAIR_RHO)),
        ),
        jobs=len(outcomes),
        outcomes=tuple(sorted(outcomes, key=lambda outcome: outcome.job_id)),
        **details,
    )
