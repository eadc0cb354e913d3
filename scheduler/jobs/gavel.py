"""Gavel's scheduling policies (Narayanan et al., OSDI'20), as linear programmes over the
throughput matrix, solved with cvxpy and HiGHS.

Every policy sees the snapshot as a matrix: ``T[i, j]`` the steps/s of job ``i`` (all its
``scale_factor`` GPUs together) on GPU type ``j``; ``c[j]`` the GPUs of type ``j``; ``s[i]`` the
job's scale factor. An allocation ``X[i, j]`` is the share of time job ``i`` should spend on type
``j``; it is feasible when ``X >= 0``, each job's shares sum to at most 1, and each type's GPUs are
not oversubscribed: ``sum_i s[i] X[i, j] <= c[j]``. Its *effective throughput* is
``sum_j T[i, j] X[i, j]``. A job may only get time on a type it can run on (throughput above 0,
at least ``s[i]`` GPUs of the type).

The ``_perf`` policies are heterogeneity-aware (they use ``T``); the others are agnostic, as
Gavel's baselines are: max-min fairness treats every type as equally fast (``T = 1``), finish-time
fairness and minimise-makespan use each job's throughput on one reference type everywhere (Gavel
hard-codes the V100; here it is the fastest type in the snapshot unless given).

The LPs are solved with HiGHS as cvxpy calls it (its defaults: dual simplex, so a vertex of the
optimal set). Some of these objectives have many optimal allocations (agnostic max-min fairness
leaves GPUs over once every job has its fair share; minimise-makespan's feasibility problems), and
which one a solver returns changes the simulated figures by a few per cent: see
docs/jobs-simulator.md. ``highs_options`` go to HiGHS as they are (``{"solver": "ipm",
"run_crossover": "off"}`` gives a central optimal solution instead).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import cvxpy as cp
import numpy as np

from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.policy import JobPolicy, SolverFailed


@dataclass(frozen=True)
class Matrix:
    """A snapshot as Gavel's policies see it (jobs that can run nowhere are left out)."""

    job_ids: tuple[str, ...]
    gpu_types: tuple[str, ...]
    throughputs: np.ndarray
    """``T``: jobs x GPU types, steps/s."""
    scale: np.ndarray
    capacity: np.ndarray
    usable: np.ndarray
    """1.0 where the job can run on the type, else 0.0."""

    @classmethod
    def of(cls, snapshot: JobsSnapshot) -> Matrix:
        types = tuple(gpu for gpu in snapshot.gpu_types if snapshot.cluster[gpu] > 0)
        capacity = np.array([snapshot.cluster[gpu] for gpu in types], dtype=float)
        rows, ids, scales, masks = [], [], [], []
        for job in snapshot.jobs:
            row = np.array([max(job.throughputs.get(gpu, 0.0), 0.0) for gpu in types])
            mask = (row > 0) & (capacity >= job.scale_factor)
            if mask.any():
                ids.append(job.job_id)
                rows.append(row * mask)
                scales.append(float(job.scale_factor))
                masks.append(mask.astype(float))
        shape = (len(ids), len(types))
        return cls(
            job_ids=tuple(ids),
            gpu_types=types,
            throughputs=np.array(rows, dtype=float).reshape(shape),
            scale=np.array(scales, dtype=float),
            capacity=capacity,
            usable=np.array(masks, dtype=float).reshape(shape),
        )

    @property
    def empty(self) -> bool:
        return not self.job_ids or not self.gpu_types

    def constraints(self, x: cp.Variable) -> list[cp.Constraint]:
        """Feasibility: shares in [0, 1] per job, no type oversubscribed, usable types only."""
        return [
            x >= 0,
            x <= self.usable,
            cp.sum(x, axis=1) <= 1,
            self.scale @ x <= self.capacity,
        ]

    def allocation(self, shares: np.ndarray, snapshot: JobsSnapshot) -> dict[str, dict[str, float]]:
        """Every snapshot job's shares per cluster type (0 for those the LP left out)."""
        clipped = np.clip(shares, 0.0, 1.0) * self.usable
        result = {job.job_id: dict.fromkeys(snapshot.gpu_types, 0.0) for job in snapshot.jobs}
        for i, job_id in enumerate(self.job_ids):
            for j, gpu in enumerate(self.gpu_types):
                result[job_id][gpu] = float(clipped[i, j])
        return result

    def reference_throughputs(self, gpu_type: str | None) -> np.ndarray:
        """Each job's throughput on one type, used on every type it can run on (agnostic)."""
        if gpu_type is None:
            best = self.throughputs / np.maximum(self.throughputs.max(axis=1, keepdims=True), 1e-12)
            column = int(np.argmax(best.sum(axis=0)))
        elif gpu_type in self.gpu_types:
            column = self.gpu_types.index(gpu_type)
        else:
            raise SolverFailed(f"reference GPU type {gpu_type!r} is not in the cluster")
        reference = self.throughputs[:, column]
        fallback = self.throughputs.max(axis=1)  # a job that cannot use the reference type
        reference = np.where(reference > 0, reference, fallback)
        return reference[:, None] * self.usable


def solve(problem: cp.Problem, what: str, options: Mapping[str, Any]) -> None:
    """Solve with HiGHS; `SolverFailed` when it returns no optimal point."""
    try:
        problem.solve(solver=cp.HIGHS, highs_options=dict(options))
    except cp.error.SolverError as error:
        raise SolverFailed(f"{what}: HiGHS failed: {error}") from None
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise SolverFailed(f"{what}: HiGHS says {problem.status}")


def feasible(problem: cp.Problem, options: Mapping[str, Any]) -> bool:
    try:
        problem.solve(solver=cp.HIGHS, highs_options=dict(options))
    except cp.error.SolverError:
        return False
    return problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


class LinearProgramPolicy(JobPolicy):
    """A Gavel policy solved as LPs; ``highs_options`` go to HiGHS as they are."""

    heterogeneity_aware: ClassVar[bool] = True

    def __init__(self, highs_options: Mapping[str, Any] | None = None) -> None:
        self.highs_options = dict(highs_options or {})

    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        matrix = Matrix.of(snapshot)
        if matrix.empty:
            return {job.job_id: dict.fromkeys(snapshot.gpu_types, 0.0) for job in snapshot.jobs}
        return matrix.allocation(self.shares(matrix, snapshot), snapshot)

    def shares(self, matrix: Matrix, snapshot: JobsSnapshot) -> np.ndarray:
        raise NotImplementedError


class ReferenceTypeLinearProgram(LinearProgramPolicy):
    """A Gavel LP whose agnostic variant (``heterogeneity_aware = False``) uses each job's
    throughput on one reference GPU type everywhere (the fastest type unless given)."""

    def __init__(
        self,
        highs_options: Mapping[str, Any] | None = None,
        reference_gpu_type: str | None = None,
    ) -> None:
        super().__init__(highs_options)
        self.reference_gpu_type = reference_gpu_type

    def throughputs(self, matrix: Matrix) -> np.ndarray:
        if self.heterogeneity_aware:
            return matrix.throughputs
        return matrix.reference_throughputs(self.reference_gpu_type)


# -- max-min fairness (least attained service) ------------------------------------------------


class MaxMinFairnessPerfPolicy(LinearProgramPolicy):
    """Maximise the smallest effective throughput, each job's normalised by what an equal share
    of the cluster would give it and divided by its priority weight; multi-GPU jobs count their
    GPUs (a job on ``s`` GPUs needs ``1/s`` the time to receive as much)."""

    name = "max_min_fairness_perf"

    def throughputs(self, matrix: Matrix) -> np.ndarray:
        return matrix.throughputs

    def shares(self, matrix: Matrix, snapshot: JobsSnapshot) -> np.ndarray:
        throughputs = self.throughputs(matrix)
        weights = np.array([snapshot.job(job_id).priority_weight for job_id in matrix.job_ids])
        # Gavel's proportional share: every type split evenly among the jobs, each job's
        # shares scaled to sum to 1; only its ratio between jobs matters here.
        proportional = throughputs @ (matrix.capacity / matrix.capacity.sum())
        coefficients = throughputs * (matrix.scale / (weights * proportional))[:, None]
        x = cp.Variable(throughputs.shape)
        objective = cp.Maximize(cp.min(cp.sum(cp.multiply(coefficients, x), axis=1)))
        problem = cp.Problem(objective, matrix.constraints(x))
        solve(problem, self.name, self.highs_options)
        return np.asarray(x.value)


class MaxMinFairnessPolicy(MaxMinFairnessPerfPolicy):
    """Max-min fairness with every GPU type treated alike: equal GPU time per priority weight."""

    name = "max_min_fairness"
    heterogeneity_aware = False

    def throughputs(self, matrix: Matrix) -> np.ndarray:
        return matrix.usable


# -- finish-time fairness -----------------------------------------------------------------------


class FinishTimeFairnessPerfPolicy(ReferenceTypeLinearProgram):
    """Minimise the largest finish-time fairness ``rho``: the job's expected completion time under
    this allocation (time since arrival + steps left / effective throughput) over its time in
    isolation (all its steps at the throughput of an equal 1/n share of the cluster).

    ``rho`` is quasi-linear in ``X``, so it is found by bisection: for a given ``rho`` every job
    needs a least effective throughput, a feasibility LP. The isolated time counts done steps at
    today's isolated throughput (Gavel accumulates it over past shares; a snapshot has no past).
    """

    name = "finish_time_fairness_perf"
    tolerance = 1e-3
    max_solves = 60

    def shares(self, matrix: Matrix, snapshot: JobsSnapshot) -> np.ndarray:
        throughputs = self.throughputs(matrix)
        views = [snapshot.job(job_id) for job_id in matrix.job_ids]
        left = np.array([job.steps_left for job in views])
        elapsed = np.array([max(snapshot.now_s - job.arrival_s, 0.0) for job in views])
        total = np.array([float(job.total_steps) for job in views])
        isolated_time = total / isolated_throughputs(matrix, throughputs)
        x = cp.Variable(throughputs.shape)
        needed = cp.Parameter(len(views), nonneg=True)
        problem = cp.Problem(
            cp.Maximize(0),
            [*matrix.constraints(x), cp.sum(cp.multiply(throughputs, x), axis=1) >= needed],
        )

        def try_rho(rho: float) -> np.ndarray | None:
            slack = rho * isolated_time - elapsed
            if np.any(slack <= 0):
                return None
            needed.value = left / slack
            return np.asarray(x.value) if feasible(problem, self.highs_options) else None

        low = float(np.max(elapsed / isolated_time))
        _, best = bisect_upward(try_rho, low, self.tolerance, self.max_solves, self.name)
        return best


class FinishTimeFairnessPolicy(FinishTimeFairnessPerfPolicy):
    """Finish-time fairness with each job's reference-type throughput used on every type."""

    name = "finish_time_fairness"
    heterogeneity_aware = False


def isolated_throughputs(matrix: Matrix, throughputs: np.ndarray) -> np.ndarray:
    """Gavel's isolated share: every type split evenly among the n jobs, in GPUs; each job's
    shares scaled down to sum to at most 1. Its effective throughput, per job."""
    jobs = len(matrix.job_ids)
    shares = (matrix.capacity[None, :] / jobs) / matrix.scale[:, None] * matrix.usable
    shares /= np.maximum(shares.sum(axis=1, keepdims=True), 1.0)
    return np.maximum(np.sum(throughputs * shares, axis=1), 1e-12)


def bisect_upward(
    attempt: Callable[[float], np.ndarray | None],
    low: float,
    tolerance: float,
    max_solves: int,
    what: str,
) -> tuple[float, np.ndarray]:
    """The smallest value (to ``tolerance``, relative) above ``low`` at which ``attempt`` finds a
    solution, and that solution; `SolverFailed` if none is found in ``max_solves`` tries."""
    solves = 0
    high = max(low * 2.0, low + 1.0)
    best = None
    while best is None:
        if solves >= max_solves:
            raise SolverFailed(f"{what}: no feasible allocation found in {solves} solves")
        best = attempt(high)
        solves += 1
        if best is None:
            low, high = high, high * 2.0
    while high - low > tolerance * high and solves < max_solves:
        middle = (low + high) / 2.0
        found = attempt(middle)
        solves += 1
        if found is None:
            low = middle
        else:
            high, best = middle, found
    return high, best


# -- minimise makespan (min total duration) -----------------------------------------------------


class MinTotalDurationPerfPolicy(ReferenceTypeLinearProgram):
    """Minimise the time ``M`` by which every job finishes: the least ``M`` for which each job
    gets an effective throughput of at least ``steps left / M``. Found as Gavel finds it, by
    bisection on ``M`` between 100 s and 10^6 s (the window moved up tenfold while nothing is
    feasible) until the bounds are within 5 %, keeping the last feasible allocation."""

    name = "min_total_duration_perf"
    low_s = 100.0
    high_s = 1e6
    ratio = 1.05
    max_windows = 6

    def shares(self, matrix: Matrix, snapshot: JobsSnapshot) -> np.ndarray:
        throughputs = self.throughputs(matrix)
        left = np.array([snapshot.job(job_id).steps_left for job_id in matrix.job_ids])
        x = cp.Variable(throughputs.shape)
        inverse_makespan = cp.Parameter(nonneg=True)
        problem = cp.Problem(
            cp.Maximize(0),
            [
                *matrix.constraints(x),
                cp.sum(cp.multiply(throughputs, x), axis=1) >= left * inverse_makespan,
            ],
        )
        low, high = self.low_s, self.high_s
        for _window in range(self.max_windows):
            best = None
            window_high = high
            while self.ratio * low < high:
                makespan = (low + high) / 2.0
                inverse_makespan.value = 1.0 / makespan
                if feasible(problem, self.highs_options):
                    best, high = np.asarray(x.value), makespan
                else:
                    low = makespan
            if best is not None:
                return best
            low, high = window_high, window_high * 10.0
        raise SolverFailed(f"{self.name}: no makespan up to {high:g} s is feasible")


class MinTotalDurationPolicy(MinTotalDurationPerfPolicy):
    """Minimise makespan with each job's reference-type throughput used on every type."""

    name = "min_total_duration"
    heterogeneity_aware = False


# -- FIFO ---------------------------------------------------------------------------------------


class FifoPerfPolicy(JobPolicy):
    """First in, first out, no preemption: jobs in arrival order each take ``scale_factor`` whole
    GPUs of one type until they finish; the queue stops at the first job that fits nowhere.
    A job keeps the type it started on (the one it has run on, from ``time_on``); a new job takes
    the type where it runs fastest. Jobs left waiting are absent from the allocation."""

    name = "fifo_perf"
    heterogeneity_aware: ClassVar[bool] = True
    fills_idle_gpus: ClassVar[bool] = False
    """A FIFO job runs only on the type it holds (`RoundScheduler`'s ``fill_idle``)."""

    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        free = dict(snapshot.cluster)
        placed: dict[str, str] = {}
        queue: list[JobView] = []
        ordered = sorted(enumerate(snapshot.jobs), key=lambda item: (item[1].arrival_s, item[0]))
        for _, job in ordered:
            started = [gpu for gpu, seconds in job.time_on.items() if seconds > 0 and gpu in free]
            if started and free[started[0]] >= job.scale_factor:
                placed[job.job_id] = started[0]
                free[started[0]] -= job.scale_factor
            else:
                queue.append(job)
        for job in queue:
            fitting = [
                gpu
                for gpu in snapshot.gpu_types
                if free[gpu] >= job.scale_factor and job.can_run_on(gpu)
            ]
            if not fitting:
                break
            gpu = self.choose(job, fitting)
            placed[job.job_id] = gpu
            free[gpu] -= job.scale_factor
        return {
            job_id: {gpu: (1.0 if gpu == chosen else 0.0) for gpu in snapshot.gpu_types}
            for job_id, chosen in placed.items()
        }

    def choose(self, job: JobView, fitting: list[str]) -> str:
        return max(fitting, key=lambda gpu: job.throughputs.get(gpu, 0.0))


class FifoPolicy(FifoPerfPolicy):
    """FIFO with the GPU type of a new job drawn at random among those with room (as Gavel's
    agnostic FIFO does); ``seed`` makes the draws repeatable."""

    name = "fifo"
    heterogeneity_aware = False

    def __init__(self, seed: int | None = 0) -> None:
        self.random = random.Random(seed)

    def choose(self, job: JobView, fitting: list[str]) -> str:
        return fitting[self.random.randrange(len(fitting))]
