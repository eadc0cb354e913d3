"""Shockwave (NSDI'23): plan the next rounds as a market, keep finish times fair.

Every round Shockwave looks ``future_rounds`` rounds ahead and solves a mixed-integer programme
(cvxpy, HiGHS):

- a binary ``run[j, t]`` per job and round; the GPUs of the jobs run in a round fit the cluster;
- job ``j`` progresses by ``q[j]`` (a share of its whole work), at most as much as the rounds it
  runs allow at its current speed;
- the objective is Nash social welfare, the weighted sum of ``log(progress)`` over the jobs
  (normalised by jobs x rounds), less ``k`` times the longest remaining run time after the window.
  ``log`` is approximated piecewise-linearly between ``log_approximation_bases`` (0 stands for
  ``log_origin``). Shockwave's own code encodes that approximation with SOS2 binaries; since
  ``log`` is concave and maximised, the hypograph of its chords (``u <= chord_s(progress)`` for
  every segment ``s``) is exact and needs no binaries: the same optimum, a smaller MILP;
- finish-time fairness: a job's finish time if, after the window, it ran at an equal share of the
  cluster, stays within ``rho_max`` of its *fair* finish time (Shockwave's running,
  momentum-weighted average of its finish time under an equal share, re-estimated whenever jobs
  arrive or leave).
  When that is infeasible Shockwave *relaxes* it: the constraints go, and the log-utility of each
  job already past ``rho_max`` is multiplied by ``rho ** lambda`` (``rho ** 100`` for a job within a
  round of its end; capped at `PRIORITY_CAP` here, where HiGHS's tolerances hold), and a second
  MILP reorders the planned rounds so that high-priority jobs run first.

Remaining run times come from `BatchSizePosterior` (kernelfleet.scheduler.jobs.dynamics),
Shockwave's Dirichlet posterior over the batch sizes a job will train at.

Shockwave's planner sees a job in whole epochs (its ``JobMetaData.epoch_progress``, the
simulator's ``floor(steps / steps per epoch)``), and so does this one: the progress in the
log-utility is the epochs completed over the job's epochs; the remaining run time is the
posterior's estimate for the epochs *after* the one in progress (Shockwave's
``dirichlet_posterior_remaining_runtime`` counts epochs ``0..progress`` as seen and subtracts them
from the posterior's expected epochs, so the epoch in progress is neither done nor to do). That
is the remaining run time wherever the planner reads it: the ``k`` term, the finish-time estimates
and constraints, the relaxation's ratios (a job in its last epoch counts as ending within a round)
and the work-conserving fill: idle GPUs left in a planned round go to the unplanned jobs with the
longest remaining time.

A fair-finish-time estimate counts from the job's *submission* as Shockwave's planner knows it:
its scheduler registers a job (``JobMetaData.register_job_submit``) at the round boundary where it
is added, the first after its arrival; here, the first snapshot that shows the job.

The solver runs under ``solver_timeout`` seconds and ``solver_rel_gap``. A solve that hits the time
limit with a feasible schedule found (HiGHS's incumbent) uses it; with none, or any other solver
failure, `allocate` raises `SolverFailed` with the reason, and the caller's `decide` runs its
fallback policy.

State (documented, as `JobPolicy` allows): the policy keeps, by job id, each job's posterior (the
batch sizes it was seen at, round by round) and its series of fair-finish-time estimates, and the
plan it last solved; it re-solves when the set of jobs or GPUs changes and every
``reoptimise_every`` rounds (8 in Shockwave's code), otherwise it plays the next round of its plan.
From a snapshot alone (a fresh policy) it decides from what that snapshot shows.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import cvxpy as cp
import numpy as np

from kernelfleet.scheduler.jobs.dynamics import BatchSizePosterior
from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.policy import JobPolicy, SolverFailed

PRIORITY_CAP = 1e6
"""Largest relaxation priority used: Shockwave's ``rho ** 100`` overflows any MILP's tolerances."""
UNKNOWN_EPOCHS = 100
"""The posterior's unit for a job that does not say its epochs: hundredths of its work."""
MOMENTUM = 0.9
FEASIBLE_SOLUTION = 2
"""HiGHS's ``kSolutionStatusFeasible``: its answer is a feasible point."""
NO_PLAN_IN_TIME = "time limit without a feasible plan"
EPOCH_TOLERANCE = 1e-9
"""Epoch progress within this of a whole number counts as that epoch completed (float steps)."""


@dataclass(frozen=True)
class ShockwaveConfig:
    """Shockwave's options; `load` reads its configuration JSON as it is."""

    future_rounds: int = 20
    k: float = 1e-3
    lam: float = 12.0
    rho_max: float = 1.0
    log_approximation_bases: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    log_origin: float = 1e-6
    solver_rel_gap: float = 1e-3
    solver_threads: int = 0
    """0: HiGHS's own choice."""
    solver_timeout: float = 15.0
    reoptimise_every: int = 8
    relax_infeasible: bool = True
    """False: an infeasible finish-time constraint raises `SolverFailed` instead of relaxing."""

    JSON_KEYS = {
        "future_rounds": "future_rounds",
        "k": "k",
        "lambda": "lam",
        "rhomax": "rho_max",
        "log_approximation_bases": "log_approximation_bases",
        "solver_rel_gap": "solver_rel_gap",
        "solver_num_threads": "solver_threads",
        "solver_timeout": "solver_timeout",
    }
    IGNORED_JSON_KEYS = frozenset({"gpu_ram"})
    """GPU memory: Shockwave's configuration carries it, its planner never reads it."""

    def __post_init__(self) -> None:
        bases = self.log_approximation_bases
        if self.future_rounds < 1 or self.reoptimise_every < 1:
            raise ValueError("future_rounds and reoptimise_every must be at least 1")
        if len(bases) < 2 or bases[0] != 0.0 or bases[-1] != 1.0 or list(bases) != sorted(bases):
            raise ValueError(f"log_approximation_bases must rise from 0 to 1, not {bases}")
        if self.solver_timeout <= 0 or self.k < 0 or self.rho_max <= 0:
            raise ValueError("solver_timeout and rho_max must be positive, k non-negative")

    @classmethod
    def load(cls, path: str | Path) -> ShockwaveConfig:
        """The options in Shockwave's configuration JSON (e.g. ``tacc_32gpus.json``);
        `ValueError` for a key it does not know."""
        raw = json.loads(Path(path).read_text())
        unknown = set(raw) - set(cls.JSON_KEYS) - cls.IGNORED_JSON_KEYS
        if unknown:
            raise ValueError(f"{path}: unknown Shockwave options {sorted(unknown)}")
        options = {cls.JSON_KEYS[key]: value for key, value in raw.items() if key in cls.JSON_KEYS}
        if "log_approximation_bases" in options:
            options["log_approximation_bases"] = tuple(options["log_approximation_bases"])
        return cls(**options)


@dataclass(frozen=True)
class SolveReport:
    """How the last solve went: for logs, tests and the benchmark."""

    jobs: int
    seconds: float
    relaxed: bool
    incumbent_only: bool
    """The time limit was hit and HiGHS's best feasible schedule so far was used."""


@dataclass(frozen=True)
class _Plan:
    start_s: float
    job_ids: frozenset[str]
    cluster: tuple[tuple[str, int], ...]
    rounds: tuple[tuple[str, ...], ...]


@dataclass
class _WindowProblem:
    """One planning window, in arrays indexed like ``jobs``."""

    jobs: Sequence[JobView]
    capacity: int
    rounds: int
    round_s: float
    gpus: np.ndarray
    weight: np.ndarray
    progress: np.ndarray
    """Share of each job's epochs completed, in [0, 1] (whole epochs: module docstring)."""
    work_s: np.ndarray
    """Each job's whole work in seconds at its current speed."""
    remaining_s: np.ndarray
    """The posterior's expected run time after the epoch in progress."""
    fair_finish_s: np.ndarray
    window_end_s: float
    equal_share: float
    ratios: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Projected finish time over fair finish time, now (the relaxation's rho)."""


class ShockwavePolicy(JobPolicy):
    """Shockwave's planner as a `JobPolicy`: share 1.0 on one GPU type for the jobs run next round.

    Options: ``config`` (a `ShockwaveConfig` or the path of Shockwave's configuration JSON) and
    any `ShockwaveConfig` field by keyword, which overrides it. Heterogeneity-agnostic, as the
    paper: it plans on the cluster's total GPUs, then puts each chosen job on the GPU type, with
    room, where it runs fastest (a job that fits on no type then waits the round).
    """

    name = "shockwave"
    replans_every_round = True

    def __init__(self, config: ShockwaveConfig | str | Path | None = None, **options: object):
        base = config if isinstance(config, ShockwaveConfig) else None
        if isinstance(config, str | Path):
            base = ShockwaveConfig.load(config)
        known = {f.name for f in fields(ShockwaveConfig)}
        unknown = set(options) - known
        if unknown:
            raise TypeError(f"unknown Shockwave options {sorted(unknown)}")
        self.config = replace(base or ShockwaveConfig(), **options)  # type: ignore[arg-type]
        self._posteriors: dict[str, BatchSizePosterior] = {}
        self._fair_finish: dict[str, list[tuple[float, float]]] = {}
        self._estimated_for: frozenset[str] | None = None
        self._submitted_s: dict[str, float] = {}
        self._last_seen_s: float | None = None
        self._plan: _Plan | None = None
        self.last_solve: SolveReport | None = None

    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        capacity = sum(snapshot.cluster.values())
        runnable = [
            job
            for job in snapshot.jobs
            if job.steps_left > 0
            and job.scale_factor <= capacity
            and any(job.can_run_on(gpu) for gpu in snapshot.cluster)
        ]
        self._observe(snapshot, runnable)
        chosen = self._round(snapshot, runnable) if runnable else ()
        allocation: dict[str, dict[str, float]] = {job.job_id: {} for job in snapshot.jobs}
        for job_id, gpu_type in _place(snapshot, chosen).items():
            allocation[job_id] = {gpu_type: 1.0}
        return allocation

    # -- state kept across rounds -----------------------------------------------------------

    def _observe(self, snapshot: JobsSnapshot, jobs: Sequence[JobView]) -> None:
        present = {job.job_id for job in jobs}
        for gone in set(self._posteriors) - present:
            del self._posteriors[gone]
            self._fair_finish.pop(gone, None)
            self._submitted_s.pop(gone, None)
        for job in jobs:
            posterior = self._posteriors.get(job.job_id)
            if posterior is None:
                regimes = tuple(sorted(job.regime_throughputs)) or (job.batch_size or 0,)
                posterior = BatchSizePosterior(regimes, job.epochs or UNKNOWN_EPOCHS)
                self._posteriors[job.job_id] = posterior
                self._submitted_s[job.job_id] = self._submission_s(snapshot, job)
            posterior.observe(_epoch_progress(job, posterior.epochs), job.batch_size or 0)
        if frozenset(present) != self._estimated_for:
            share = _equal_share(snapshot, jobs)
            for job in jobs:
                run_s = sum(job.time_on.values())
                alone_s = run_s + self._remaining_s(snapshot, job)
                estimate = self._submitted_s[job.job_id] + alone_s / share
                self._fair_finish.setdefault(job.job_id, []).append((snapshot.now_s, estimate))
            self._estimated_for = frozenset(present)
        self._last_seen_s = snapshot.now_s

    def _submission_s(self, snapshot: JobsSnapshot, job: JobView) -> float:
        """When the planner learnt of a job it sees for the first time: now, for a job that
        arrived since its last snapshot (Shockwave registers a job's submission when the round
        after its arrival starts); its arrival, for one it could not have seen (a fresh policy)."""
        arrived_unseen = self._last_seen_s is not None and job.arrival_s > self._last_seen_s
        return snapshot.now_s if arrived_unseen else job.arrival_s

    def _remaining_s(self, snapshot: JobsSnapshot, job: JobView) -> float:
        """The posterior's expected run time of the epochs after the one in progress, which
        Shockwave's planner counts as seen (module docstring)."""
        posterior = self._posteriors[job.job_id]
        epochs = posterior.epochs
        steps_after = job.total_steps * max(epochs - _whole_epochs(job, epochs) - 1, 0) / epochs
        return posterior.remaining_time(steps_after, _rates_by_batch_size(snapshot, job))

    def _fair_finish_s(self, job_id: str, now_s: float) -> float:
        """Shockwave's momentum average of a job's fair-finish-time estimates: each weighted by how
        long it stood, then blended 0.9 : 0.1 with the latest."""
        series = self._fair_finish[job_id]
        times = [at for at, _ in series] + [now_s]
        windows = np.diff(times)
        values = np.array([value for _, value in series])
        average = values[-1] if windows.sum() <= 0 else float(windows @ values / windows.sum())
        return MOMENTUM * average + (1.0 - MOMENTUM) * values[-1]

    # -- the round to run -------------------------------------------------------------------

    def _round(self, snapshot: JobsSnapshot, jobs: Sequence[JobView]) -> tuple[str, ...]:
        job_ids = frozenset(job.job_id for job in jobs)
        cluster = tuple(snapshot.cluster.items())
        plan = self._plan
        if plan is not None and plan.job_ids == job_ids and plan.cluster == cluster:
            offset = round((snapshot.now_s - plan.start_s) / snapshot.round_s)
            if 0 <= offset < min(self.config.reoptimise_every, len(plan.rounds)):
                return plan.rounds[offset]
        problem = self._problem(snapshot, jobs)
        rounds = self._solve(problem)
        self._plan = _Plan(snapshot.now_s, job_ids, cluster, rounds)
        return rounds[0]

    def _problem(self, snapshot: JobsSnapshot, jobs: Sequence[JobView]) -> _WindowProblem:
        share = _equal_share(snapshot, jobs)
        rates = np.array([_best_rate(snapshot, job.throughputs) for job in jobs])
        remaining = np.array([self._remaining_s(snapshot, job) for job in jobs])
        fair = np.array([self._fair_finish_s(job.job_id, snapshot.now_s) for job in jobs])
        problem = _WindowProblem(
            jobs=jobs,
            capacity=sum(snapshot.cluster.values()),
            rounds=self.config.future_rounds,
            round_s=snapshot.round_s,
            gpus=np.array([job.scale_factor for job in jobs], dtype=float),
            weight=np.array([job.priority_weight for job in jobs], dtype=float),
            progress=np.array(
                [
                    _whole_epochs(job, self._posteriors[job.job_id].epochs)
                    / self._posteriors[job.job_id].epochs
                    for job in jobs
                ]
            ),
            work_s=np.array([job.total_steps for job in jobs]) / rates,
            remaining_s=remaining,
            fair_finish_s=fair,
            window_end_s=snapshot.now_s + self.config.future_rounds * snapshot.round_s,
            equal_share=share,
        )
        problem.ratios = (snapshot.now_s + remaining / share) / fair
        return problem

    def _solve(self, problem: _WindowProblem) -> tuple[tuple[str, ...], ...]:
        started = time.monotonic()
        config = self.config
        run, utility, objective_tail, constraints, remaining_after = _window_model(problem, config)
        n, rounds = len(problem.jobs), problem.rounds
        welfare = cp.sum(cp.multiply(problem.weight, utility)) / (n * rounds)
        fairness = [
            problem.window_end_s + remaining_after / problem.equal_share
            <= config.rho_max * problem.fair_finish_s
        ]
        status, incumbent = _run(
            cp.Problem(cp.Maximize(welfare - objective_tail), [*constraints, *fairness]), config
        )
        relaxed = status in cp.settings.INF_OR_UNB
        if relaxed:
            if not config.relax_infeasible:
                raise SolverFailed("infeasible: the finish-time-fairness constraints admit no plan")
            priorities = _priorities(problem, config)
            upgraded = cp.sum(cp.multiply(problem.weight * priorities, utility)) / (n * rounds)
            status, incumbent = _run(
                cp.Problem(cp.Maximize(upgraded - objective_tail), constraints), config
            )
        if status not in cp.settings.SOLUTION_PRESENT or run.value is None:
            raise SolverFailed(_failure_reason(status, config))
        planned = np.rint(run.value).astype(bool)
        if relaxed:
            planned = _rank_rounds(planned, priorities, problem, config)
        self.last_solve = SolveReport(n, time.monotonic() - started, relaxed, incumbent)
        return _with_idle_gpus_filled(planned, problem)


def _window_model(
    problem: _WindowProblem, config: ShockwaveConfig
) -> tuple[cp.Variable, cp.Variable, cp.Expression, list[cp.Constraint], cp.Variable]:
    """The variables and constraints both of Shockwave's solves share: runs, progress, the log
    approximation's hypograph, the remaining run time after the window and its maximum (``k``)."""
    n, rounds = len(problem.jobs), problem.rounds
    run = cp.Variable((n, rounds), boolean=True)
    gained = cp.Variable(n, nonneg=True)
    utility = cp.Variable(n)
    remaining_after = cp.Variable(n, nonneg=True)
    longest = cp.Variable(nonneg=True)
    bases = np.array(config.log_approximation_bases)
    logs = np.log(np.maximum(bases, config.log_origin))
    slopes = np.diff(logs) / np.diff(bases)
    progress = problem.progress + gained
    constraints: list[cp.Constraint] = [
        problem.gpus @ run <= problem.capacity,
        progress <= 1.0,
        cp.multiply(gained, problem.work_s) <= problem.round_s * cp.sum(run, axis=1),
        remaining_after >= problem.remaining_s - cp.multiply(gained, problem.work_s),
        longest >= remaining_after,
    ]
    constraints += [
        utility <= logs[s] + slopes[s] * (progress - bases[s]) for s in range(len(slopes))
    ]
    return run, utility, config.k * longest, constraints, remaining_after


def _run(problem: cp.Problem, config: ShockwaveConfig) -> tuple[str, bool]:
    """Solve with HiGHS under the time limit; returns the status and whether the answer is an
    incumbent cut short by the limit."""
    options: dict[str, object] = {
        "time_limit": float(config.solver_timeout),
        "mip_rel_gap": float(config.solver_rel_gap),
        "output_flag": False,
    }
    if config.solver_threads:
        # Shockwave's configurations ask for 24 threads; more than the machine has only thrashes.
        options["threads"] = min(int(config.solver_threads), os.cpu_count() or 1)
    try:
        with warnings.catch_warnings():
            # cvxpy warns of every answer cut short by the time limit: the caller reads the status
            warnings.filterwarnings("ignore", "Solution may be inaccurate", UserWarning)
            problem.solve(solver=cp.HIGHS, **options)
    except cp.SolverError as error:
        raise SolverFailed(f"HiGHS failed: {error}") from error
    if problem.status != cp.USER_LIMIT:
        return problem.status, False
    # At the time limit cvxpy hands back HiGHS's columns whether or not they are a feasible plan.
    info = problem.solver_stats.extra_stats
    if getattr(info, "primal_solution_status", 0) == FEASIBLE_SOLUTION:
        return cp.USER_LIMIT, True
    return NO_PLAN_IN_TIME, False


def _failure_reason(status: str, config: ShockwaveConfig) -> str:
    if status == NO_PLAN_IN_TIME:
        return f"time limit of {config.solver_timeout:g} s reached with no feasible plan"
    return f"HiGHS answered {status!r}"


def _priorities(problem: _WindowProblem, config: ShockwaveConfig) -> np.ndarray:
    """Shockwave's relaxation: ``rho ** lambda`` for a job past ``rho_max`` (``rho ** 100`` if it
    ends within a round), 1 for the others."""
    priorities = np.ones(len(problem.jobs))
    for j, ratio in enumerate(problem.ratios):
        if ratio > config.rho_max:
            power = 100.0 if problem.remaining_s[j] < problem.round_s else config.lam
            priorities[j] = min(math.exp(power * math.log(ratio)), PRIORITY_CAP)
    return priorities


def _rank_rounds(
    planned: np.ndarray, priorities: np.ndarray, problem: _WindowProblem, config: ShockwaveConfig
) -> np.ndarray:
    """Shockwave's second solve after a relaxation: the same number of rounds per job, moved so
    that the priority-weighted mean round index is least (high priorities run first). Keeps the
    first plan if this solve gives no answer."""
    counts = planned.sum(axis=1)
    if not counts.any():
        return planned
    n, rounds = planned.shape
    ranked = cp.Variable((n, rounds), boolean=True)
    scale = np.where(counts > 0, priorities / np.maximum(counts, 1), 0.0)
    scale = scale / scale.max()
    objective = cp.Minimize(cp.sum(cp.multiply(np.outer(scale, np.arange(rounds)), ranked)))
    constraints = [cp.sum(ranked, axis=1) == counts, problem.gpus @ ranked <= problem.capacity]
    status, _ = _run(cp.Problem(objective, constraints), config)
    if status not in cp.settings.SOLUTION_PRESENT or ranked.value is None:
        return planned
    return np.rint(ranked.value).astype(bool)


def _with_idle_gpus_filled(
    planned: np.ndarray, problem: _WindowProblem
) -> tuple[tuple[str, ...], ...]:
    """Each planned round's job ids, idle GPUs given to unplanned jobs, longest remaining first."""
    by_remaining = np.argsort(-problem.remaining_s, kind="stable")
    rounds = []
    for t in range(planned.shape[1]):
        chosen = [j for j in range(len(problem.jobs)) if planned[j, t]]
        free = problem.capacity - sum(problem.gpus[j] for j in chosen)
        for j in by_remaining:
            if free <= 0:
                break
            if not planned[j, t] and problem.gpus[j] <= free:
                chosen.append(int(j))
                free -= problem.gpus[j]
        rounds.append(tuple(problem.jobs[j].job_id for j in chosen))
    return tuple(rounds)


def _place(snapshot: JobsSnapshot, job_ids: Sequence[str]) -> dict[str, str]:
    """A GPU type for each chosen job, largest jobs first: the type with room where it runs
    fastest (ties: the cluster's order). A job that fits nowhere is left out."""
    free = dict(snapshot.cluster)
    placed: dict[str, str] = {}
    jobs = sorted((snapshot.job(job_id) for job_id in job_ids), key=lambda j: -j.scale_factor)
    for job in jobs:
        fits = [gpu for gpu in free if free[gpu] >= job.scale_factor and job.can_run_on(gpu)]
        if fits:
            gpu_type = max(fits, key=lambda gpu: job.throughputs[gpu])
            placed[job.job_id] = gpu_type
            free[gpu_type] -= job.scale_factor
    return placed


def _best_rate(snapshot: JobsSnapshot, rates: Mapping[str, float]) -> float:
    return max((rates.get(gpu, 0.0) for gpu in snapshot.cluster), default=0.0)


def _equal_share(snapshot: JobsSnapshot, jobs: Sequence[JobView]) -> float:
    return min(1.0, sum(snapshot.cluster.values()) / max(len(jobs), 1))


def _epoch_progress(job: JobView, epochs: int) -> float:
    return job.steps_done / job.total_steps * epochs if job.total_steps else 0.0


def _whole_epochs(job: JobView, epochs: int) -> int:
    """Epochs the job has completed (the one in progress not counted), at most ``epochs``."""
    return min(math.floor(_epoch_progress(job, epochs) + EPOCH_TOLERANCE), epochs)


def _rates_by_batch_size(snapshot: JobsSnapshot, job: JobView) -> dict[int, float]:
    regimes = job.regime_throughputs or {job.batch_size or 0: job.throughputs}
    return {size: _best_rate(snapshot, rates) for size, rates in regimes.items()}
