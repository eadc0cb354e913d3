"""PipeDream's hierarchical planner: machines of several GPUs, a bandwidth per level.

`plan_hierarchical(profile, [(gpus, intra_bandwidth), (machines, inter_bandwidth)])` is
PipeDream's ``optimizer_graph_hierarchical.py -n gpus machines -b intra inter`` with its
defaults (no memory limit, activation transfers not counted, every worker used). Levels go from
the innermost out; the workers are the product of their counts.

Each level solves the programme of `kernelfleet.tools.pipeline.planner` over "workers" that are
the level below's whole groups:

- the innermost level works on the profile's stage costs; a level above takes, as the compute
  time of a stage ``[i, j]``, the best time of ``[i, j]`` pipelined over one whole group of the
  level below (so every level but the outermost solves for every first layer ``i``, not only 0);
- a stage on ``r`` replicas takes ``(T + 4 (r - 1) P / (B r) / g) / r`` when it is one stage from
  its segment's first layer, ``g`` being the size of a group of the level below (1 innermost), and
  ``(T + 4 (r - 1) P / (B r)) / r`` when it follows a split. That difference is PipeDream's code
  as published (its split step does not divide the synchronisation by ``g``), kept so that plans
  and figures match it;
- a segment that starts after a split at ``k`` can only end at a layer ``k`` is upstream of (a
  cut of the graph). PipeDream's code does not check that for the levels below the outermost;
  on the published profiles it made no difference (docs/pipeline.md);
- data parallelism over all workers takes, level by level from the innermost, ``D <- (D + 4 (n -
  1) P / (B n) / g) / n`` starting from the whole model's compute time.

The plan's stages are the innermost level's, within each stage of the levels above; a stage's
replicas are the product of its replication at every level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.planner import Plan, Stage
from kernelfleet.tools.pipeline.profiles import ModelProfile


@dataclass(frozen=True)
class Level:
    """``count`` workers (GPUs, or groups of the level below) joined at ``bandwidth`` bytes/s."""

    count: int
    bandwidth: float


@dataclass(frozen=True)
class _LevelTable:
    """``[i, j, w]``: the best time of layers ``i..j`` on ``w`` workers of this level, the split
    before the last stage (-1: none) and the last stage's replicas."""

    time_s: np.ndarray
    split: np.ndarray
    replicas: np.ndarray


def _segments(profile: ModelProfile) -> tuple[np.ndarray, np.ndarray]:
    """Compute time and parameter bytes of every segment ``[i, j]`` (inf where ``j < i``)."""
    n = len(profile)
    compute = np.full((n, n), np.inf)
    parameters = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            cost = profile.stage(i, j)
            compute[i, j], parameters[i, j] = cost.compute_s, cost.parameter_bytes
    return compute, parameters


def _solve_level(
    profile: ModelProfile,
    compute: np.ndarray,
    parameters: np.ndarray,
    level: Level,
    within: int,
    first_rows: range,
) -> _LevelTable:
    n, total, bandwidth = len(profile), level.count, level.bandwidth
    shape = (n, n, total + 1)
    table = _LevelTable(np.full(shape, np.inf), np.full(shape, -1), np.zeros(shape, dtype=int))
    for w in range(1, total + 1):
        table.time_s[:, :, w] = (compute + 4 * (w - 1) * parameters / (bandwidth * w) / within) / w
        table.replicas[:, :, w] = w
    for i in range(1, n):  # a segment after a split must start at a cut before its last layer
        for j in range(i, n):
            if i - 1 not in profile.splits[j]:
                table.time_s[i, j, :] = np.inf
    for i in first_rows:
        for w in range(2, total + 1):
            r = np.arange(1, w)[None, :]
            for j in range(i + 1, n):
                k = np.array(sorted(s for s in profile.splits[j] if s >= i), dtype=int)
                if not k.size:
                    continue
                before = table.time_s[i, k[:, None], w - r]
                seg_compute = compute[k + 1, j][:, None]
                seg_parameters = parameters[k + 1, j][:, None]
                last = (seg_compute + 4 * (r - 1) * seg_parameters / (bandwidth * r)) / r
                candidates = np.maximum(before, last)
                best = int(np.argmin(candidates))
                if candidates.flat[best] < table.time_s[i, j, w]:
                    row, column = divmod(best, w - 1)
                    table.time_s[i, j, w] = candidates.flat[best]
                    table.split[i, j, w] = k[row]
                    table.replicas[i, j, w] = column + 1
    return table


def _stages_of(
    table: _LevelTable, first: int, last: int, workers: int
) -> list[tuple[int, int, int]]:
    """``(first, last, replicas)`` of the stages the table chose for ``first..last``."""
    stages = []
    j, w = last, workers
    while True:
        split, replicas = int(table.split[first, j, w]), int(table.replicas[first, j, w])
        stages.append((first if split < 0 else split + 1, j, replicas))
        if split < 0:
            return stages[::-1]
        j, w = split, w - replicas


def plan_hierarchical(profile: ModelProfile, levels: Sequence[tuple[int, float]]) -> Plan:
    """The fastest pipeline over nested levels of workers (see the module docstring).

    ``levels`` lists ``(count, bandwidth)`` from the innermost (GPUs in a machine) out. One level
    gives what `plan_pipeline` gives with its defaults.
    """
    if not levels:
        raise InvalidRequest("give at least one level: (workers, bandwidth)")
    parsed = [Level(int(count), float(bandwidth)) for count, bandwidth in levels]
    for level in parsed:
        if level.count < 1:
            raise InvalidRequest(f"every level needs at least 1 worker, got {level.count}")
        if not level.bandwidth > 0 or math.isinf(level.bandwidth):
            raise InvalidRequest(f"bandwidth must be a positive number, got {level.bandwidth}")
    n = len(profile)
    compute, parameters = _segments(profile)
    tables = []
    within = 1
    for depth, level in enumerate(parsed):
        outermost = depth == len(parsed) - 1
        table = _solve_level(
            profile, compute, parameters, level, within, range(1) if outermost else range(n)
        )
        tables.append(table)
        compute = table.time_s[:, :, level.count].copy()
        within = level.count
    ranges = [(0, n - 1, 1)]
    for depth in reversed(range(len(parsed))):
        ranges = [
            (first, last, outer * replicas)
            for start, end, outer in ranges
            for first, last, replicas in _stages_of(tables[depth], start, end, parsed[depth].count)
        ]
    workers = math.prod(level.count for level in parsed)
    stages = tuple(
        Stage(
            first,
            last,
            replicas,
            compute_s=profile.stage(first, last).compute_s,
            sync_s=0.0,
            transfer_s=0.0,
            memory_bytes=0.0,
        )
        for first, last, replicas in ranges
    )
    data_parallel = profile.total.compute_s
    within = 1
    for level in parsed:
        sync = (
            4 * (level.count - 1) * profile.total.parameter_bytes / (level.bandwidth * level.count)
        )
        data_parallel = (data_parallel + sync / within) / level.count
        within = level.count
    return Plan(
        stages=stages,
        workers=workers,
        bandwidth=parsed[-1].bandwidth,
        time_per_minibatch_s=float(tables[-1].time_s[0, n - 1, parsed[-1].count]),
        data_parallel_time_s=data_parallel,
        one_worker_time_s=profile.total.compute_s,
        levels=tuple((level.count, level.bandwidth) for level in parsed),
    )


def parse_levels(text: str) -> list[tuple[int, float]]:
    """``"4:1e10,2:1.25e9"`` -> ``[(4, 1e10), (2, 1.25e9)]``; `InvalidRequest` if malformed."""
    levels = []
    for part in text.split(","):
        count, colon, bandwidth = part.strip().partition(":")
        try:
            level = (int(count), float(bandwidth))
        except ValueError:
            level = (0, 0.0)
        if not colon or level[0] < 1 or not 0 < level[1] < math.inf:
            raise InvalidRequest(
                f"bad --levels {text!r}: write COUNT:BYTES_PER_S pairs, innermost first, "
                "e.g. 4:1e10,2:1.25e9"
            )
        levels.append(level)
    return levels
