"""PipeDream's partitioner: split a profiled model into pipeline stages, each replicated.

`plan_pipeline` solves PipeDream's dynamic programme (SOSP'19, section 3.1) for one level of
``workers`` identical workers joined by links of ``bandwidth`` bytes/s:

- A stage ``[first, last]`` on ``r`` replicas takes ``(compute + 4 (r - 1) P / (bandwidth r)) / r``
  per minibatch, ``compute`` being its layers' forward plus backward time and ``P`` their
  parameter bytes (the second term is the data-parallel weight synchronisation among the
  replicas).
- ``best(j, w)``, the time per minibatch of the slowest stage when layers ``0..j`` run on exactly
  ``w`` workers, is the smaller of that prefix as one stage on ``w`` replicas and, over every
  split ``k`` allowed before ``j`` and ``r`` in ``1..w-1``, ``max(best(k, w - r), stage(k+1..j,
  r))``. The plan is ``best(last layer, workers)``: every worker is used (PipeDream's default;
  its ``--use_fewer_machines`` is not modelled).

As in PipeDream's optimizer with its defaults, the time activations take to cross a stage
boundary is *not* counted, and memory is not limited. ``activation_compression`` (PipeDream's
``--activation_compression_ratio``) counts it: a stage on ``r`` replicas also needs
``2 A / (bandwidth r) / ratio`` for its input and its output activation ``A`` (the last stage has
no output), and the slowest of compute and those transfers sets its time. As in PipeDream, the
first stage is charged no transfer: its output is counted as the next stage's input.

``memory_bytes`` limits what one worker holds: a stage's parameter and activation bytes, once
per minibatch it keeps in flight, which under 1F1B is the number of workers from this stage to
the end of the pipeline divided by its replicas, rounded up. PipeDream's code counts only the
workers *after* the stage (so its last stage holds nothing); here the stage's own minibatch is
counted too, which is that count plus one.

Ties are broken towards the earliest split, then the fewest replicas for the last stage (PipeDream
iterates over a Python set there, so its choice among equal times varies between runs).

The baselines: data parallelism over all workers takes ``(C + 4 (W - 1) P / (bandwidth W)) / W``
for the whole model's compute ``C`` and parameters ``P``; one worker takes ``C``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.profiles import ModelProfile, Totals


class CannotPartition(InvalidRequest):
    """No split of the model into stages fits the memory limit."""

    reason = "cannot-partition"


@dataclass(frozen=True)
class Stage:
    """Layers ``first..last`` (profile order, inclusive) on ``replicas`` workers."""

    first: int
    last: int
    replicas: int
    compute_s: float
    """Forward plus backward time of one minibatch on one worker."""
    sync_s: float
    """Data-parallel weight synchronisation per minibatch among the replicas (0 for one)."""
    transfer_s: float
    """Activation transfer per minibatch (0 unless activations are counted)."""
    memory_bytes: float
    """What one replica holds: parameters and activations of the minibatches it keeps."""

    @property
    def time_s(self) -> float:
        """Time per minibatch of the stage: its replicas share the minibatches."""
        return max((self.compute_s + self.sync_s) / self.replicas, self.transfer_s)


@dataclass(frozen=True)
class Plan:
    """A pipeline: stages in order, the workers they use, and what it is predicted to gain."""

    stages: tuple[Stage, ...]
    workers: int
    bandwidth: float
    time_per_minibatch_s: float
    data_parallel_time_s: float
    one_worker_time_s: float
    levels: tuple[tuple[int, float], ...] = ()
    """Hierarchical levels ``(count, bandwidth)``, innermost first; empty for one level. A
    hierarchical plan's stages carry no ``sync_s`` (it is paid level by level) and no
    ``memory_bytes`` (not modelled there)."""

    @property
    def speedup_vs_data_parallel(self) -> float:
        return self.data_parallel_time_s / self.time_per_minibatch_s

    @property
    def speedup_vs_one_worker(self) -> float:
        return self.one_worker_time_s / self.time_per_minibatch_s

    def as_document(self) -> dict[str, object]:
        """The stable JSON interface (docs/pipeline.md): exactly these four keys."""
        return {
            "stages": [{"layers": [s.first, s.last], "replicas": s.replicas} for s in self.stages],
            "time_per_minibatch_s": self.time_per_minibatch_s,
            "speedup_vs_data_parallel": self.speedup_vs_data_parallel,
            "speedup_vs_one_worker": self.speedup_vs_one_worker,
        }


def sync_time(parameter_bytes: float, replicas: int, bandwidth: float) -> float:
    """Data-parallel weight synchronisation of one minibatch among ``replicas`` workers."""
    return 4 * (replicas - 1) * parameter_bytes / (bandwidth * replicas)


def data_parallel_time(profile: ModelProfile, workers: int, bandwidth: float) -> float:
    """Time per minibatch of the whole model replicated on ``workers`` workers."""
    total = profile.total
    return (total.compute_s + sync_time(total.parameter_bytes, workers, bandwidth)) / workers


def in_flight(workers_from_here: int, replicas: int) -> int:
    """Minibatches a replica keeps under 1F1B (see the module docstring)."""
    return math.ceil(workers_from_here / replicas)


@dataclass(frozen=True)
class _Table:
    """The programme's table, indexed ``[j, w]``: the best time for layers ``0..j`` on ``w``
    workers, the layer the stage before the last one ends at (-1: a single stage) and the last
    stage's replicas."""

    time_s: np.ndarray
    split: np.ndarray
    replicas: np.ndarray


class _Partitioner:
    def __init__(
        self,
        profile: ModelProfile,
        workers: int,
        bandwidth: float,
        memory_bytes: float | None,
        activation_compression: float | None,
    ) -> None:
        self.profile = profile
        self.workers = workers
        self.bandwidth = bandwidth
        self.memory_bytes = memory_bytes
        self.compression = activation_compression

    def stage(self, first: int, last: int, replicas: int, workers_after: int) -> Stage:
        cost: Totals = self.profile.stage(first, last)
        transfer = 0.0
        if self.compression is not None and first > 0:
            layers = self.profile.layers
            moved = [layers[first - 1].activation_bytes]
            if last < len(layers) - 1:
                moved.append(layers[last].activation_bytes)
            transfer = max(
                (2.0 * size / (self.bandwidth * replicas) / self.compression for size in moved),
                default=0.0,
            )
        kept = in_flight(workers_after + replicas, replicas)
        return Stage(
            first,
            last,
            replicas,
            compute_s=cost.compute_s,
            sync_s=sync_time(cost.parameter_bytes, replicas, self.bandwidth),
            transfer_s=transfer,
            memory_bytes=(cost.activation_bytes + cost.parameter_bytes) * kept,
        )

    def solve(self) -> _Table:
        """``best(j, w)`` for every layer ``j`` and ``w`` in ``1..workers``, vectorised over the
        split ``k`` and the last stage's replicas ``r``."""
        profile, total, bandwidth = self.profile, self.workers, self.bandwidth
        n = len(profile)
        compute = np.array([t.compute_s for t in profile.through])
        stashed = np.array([t.activation_bytes + t.parameter_bytes for t in profile.through])
        parameters = np.array([t.parameter_bytes for t in profile.through])
        outputs = np.array([layer.activation_bytes for layer in profile.layers])
        table = _Table(
            time_s=np.full((n, total + 1), np.inf),
            split=np.full((n, total + 1), -1),
            replicas=np.zeros((n, total + 1), dtype=int),
        )
        for w in range(1, total + 1):
            time_s = (compute + 4 * (w - 1) * parameters / (bandwidth * w)) / w
            if self.memory_bytes is not None:
                kept = in_flight(total, w)
                time_s = np.where(stashed * kept <= self.memory_bytes, time_s, np.inf)
            table.time_s[:, w] = time_s
            table.replicas[:, w] = w
        for w in range(2, total + 1):
            r = np.arange(1, w)[None, :]
            for j in range(1, n):
                k = np.array(sorted(profile.splits[j]), dtype=int)
                if not k.size:
                    continue
                before = table.time_s[k[:, None], w - r]
                stage_compute = (compute[j] - compute[k])[:, None]
                stage_parameters = (parameters[j] - parameters[k])[:, None]
                last = (stage_compute + 4 * (r - 1) * stage_parameters / (bandwidth * r)) / r
                if self.compression is not None:
                    moved = (
                        outputs[k][:, None]
                        if j == n - 1
                        else np.maximum(outputs[k], outputs[j])[:, None]
                    )
                    last = np.maximum(last, 2.0 * moved / (bandwidth * r) / self.compression)
                if self.memory_bytes is not None:
                    held = (stashed[j] - stashed[k])[:, None] * np.ceil((total - w + r) / r)
                    last = np.where(held <= self.memory_bytes, last, np.inf)
                candidates = np.maximum(before, last)
                best = int(np.argmin(candidates))  # the first minimum: earliest k, then fewest r
                if candidates.flat[best] < table.time_s[j, w]:
                    row, column = divmod(best, w - 1)
                    table.time_s[j, w] = candidates.flat[best]
                    table.split[j, w] = k[row]
                    table.replicas[j, w] = column + 1
        return table

    def stages(self, table: _Table) -> list[Stage]:
        stages: list[Stage] = []
        j, w = len(self.profile) - 1, self.workers
        while True:
            split, replicas = int(table.split[j, w]), int(table.replicas[j, w])
            stages.append(self.stage(split + 1, j, replicas, self.workers - w))
            if split < 0:
                return stages[::-1]
            j, w = split, w - replicas


def plan_pipeline(
    profile: ModelProfile,
    workers: int,
    bandwidth: float,
    *,
    memory_bytes: float | None = None,
    activation_compression: float | None = None,
) -> Plan:
    """The fastest pipeline of ``profile`` on ``workers`` workers (see the module docstring).

    Raises `InvalidRequest` for impossible arguments and `CannotPartition`, naming the layer that
    cannot fit when one alone cannot, when no split fits ``memory_bytes``.
    """
    if workers < 1:
        raise InvalidRequest(f"workers must be at least 1, got {workers}")
    if not bandwidth > 0 or math.isinf(bandwidth):
        raise InvalidRequest(f"bandwidth must be a positive number of bytes/s, got {bandwidth}")
    if memory_bytes is not None and not memory_bytes > 0:
        raise InvalidRequest(f"the memory limit must be positive, got {memory_bytes}")
    if activation_compression is not None and not activation_compression > 0:
        raise InvalidRequest(
            f"the activation compression ratio must be positive, got {activation_compression}"
        )
    partitioner = _Partitioner(profile, workers, bandwidth, memory_bytes, activation_compression)
    table = partitioner.solve()
    final = float(table.time_s[len(profile) - 1, workers])
    if math.isinf(final):
        raise CannotPartition(_why_not(profile, workers, memory_bytes))
    stages = partitioner.stages(table)
    return Plan(
        stages=tuple(stages),
        workers=workers,
        bandwidth=bandwidth,
        time_per_minibatch_s=final,
        data_parallel_time_s=data_parallel_time(profile, workers, bandwidth),
        one_worker_time_s=profile.total.compute_s,
    )


def _why_not(profile: ModelProfile, workers: int, memory_bytes: float | None) -> str:
    limit = f"{memory_bytes:.4g} bytes per worker"
    for j, layer in enumerate(profile.layers if profile.is_chain() else ()):
        alone = layer.activation_bytes + layer.parameter_bytes
        if alone > (memory_bytes or 0.0):
            return (
                f"cannot partition the model over {workers} workers with {limit}: layer {j} "
                f"({layer.name}, {layer.description}) alone holds {alone:.4g} bytes (parameters "
                f"{layer.parameter_bytes:.4g} + activations {layer.activation_bytes:.4g}), and a "
                "layer cannot be split across stages"
            )
    if not profile.is_chain():
        return (
            f"cannot partition the model over {workers} workers with {limit}: no split at the "
            "graph's cuts fits (a stage holds its layers' parameters and activations once per "
            "minibatch in flight); give more memory or workers"
        )
    return (
        f"cannot partition the model over {workers} workers with {limit}: every split keeps "
        "too many minibatches' activations in flight on some stage; give more memory or workers"
    )
