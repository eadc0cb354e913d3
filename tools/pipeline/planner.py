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

Ties are broken towards the earliest split and the fewest replicas for the last stage (PipeDream
iterates over a Python set there, so its choice among equal times varies between runs).

The baselines: data parallelism over all workers takes ``(C + 4 (W - 1) P / (bandwidth W)) / W``
for the whole model's compute ``C`` and parameters ``P``; one worker takes ``C``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
class _Cell:
    time_s: float
    split: int | None  # the layer the previous stage ends at; None: one stage from layer 0
    replicas: int  # of the stage that ends here


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

    def fits(self, stage: Stage) -> bool:
        return self.memory_bytes is None or stage.memory_bytes <= self.memory_bytes

    def solve(self) -> list[list[_Cell | None]]:
        """``best[j][w]`` for ``w`` in ``1..workers`` (index 0 unused)."""
        n, total = len(self.profile), self.workers
        best: list[list[_Cell | None]] = [[None] * (total + 1) for _ in range(n)]
        for j in range(n):
            for w in range(1, total + 1):
                whole = self.stage(0, j, w, total - w)
                if self.fits(whole):
                    best[j][w] = _Cell(whole.time_s, None, w)
        for w in range(2, total + 1):
            for j in range(1, n):
                cell = best[j][w]
                for k in sorted(self.profile.splits[j]):
                    for r in range(1, w):
                        before = best[k][w - r]
                        if before is None:
                            continue
                        last = self.stage(k + 1, j, r, total - w)
                        if not self.fits(last):
                            continue
                        time_s = max(before.time_s, last.time_s)
                        if cell is None or time_s < cell.time_s:
                            cell = _Cell(time_s, k, r)
                best[j][w] = cell
        return best

    def stages(self, best: list[list[_Cell | None]]) -> list[Stage]:
        stages: list[Stage] = []
        j, w = len(self.profile) - 1, self.workers
        while True:
            cell = best[j][w]
            assert cell is not None  # the caller checked the full plan exists
            first = 0 if cell.split is None else cell.split + 1
            stages.append(self.stage(first, j, cell.replicas, self.workers - w))
            if cell.split is None:
                return stages[::-1]
            j, w = cell.split, w - cell.replicas


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
    best = partitioner.solve()
    final = best[len(profile) - 1][workers]
    if final is None:
        raise CannotPartition(_why_not(profile, workers, memory_bytes))
    stages = partitioner.stages(best)
    return Plan(
        stages=tuple(stages),
        workers=workers,
        bandwidth=bandwidth,
        time_per_minibatch_s=final.time_s,
        data_parallel_time_s=data_parallel_time(profile, workers, bandwidth),
        one_worker_time_s=profile.total.compute_s,
    )


def _why_not(profile: ModelProfile, workers: int, memory_bytes: float | None) -> str:
    limit = f"{memory_bytes:.4g} bytes per worker"
    for j, layer in enumerate(profile.layers):
        alone = layer.activation_bytes + layer.parameter_bytes
        if alone > (memory_bytes or 0.0):
            return (
                f"cannot partition the model over {workers} workers with {limit}: layer {j} "
                f"({layer.name}, {layer.description}) alone holds {alone:.4g} bytes (parameters "
                f"{layer.parameter_bytes:.4g} + activations {layer.activation_bytes:.4g}), and a "
                "layer cannot be split across stages"
            )
    return (
        f"cannot partition the model over {workers} workers with {limit}: every split keeps "
        "too many minibatches' activations in flight on some stage; give more memory or workers"
    )
