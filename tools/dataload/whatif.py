"""DS-Analyzer's what-if: a training epoch's time on other CPU counts and cache sizes, predicted
from three measured rates. Pure arithmetic over a frozen `StallProfile`; no I/O.

The model (per minibatch; an epoch is ``batches_per_epoch`` of them)::

    time(n, c) = max(compute, prep_cpu / n) + (1 - h(c)) * fetch
    h(c)       = min(1, c / dataset_bytes)

- ``compute``: the model's step on data already in memory (the GPU- or compute-bound rate);
- ``prep_cpu``: CPU-seconds to decode and transform one minibatch; the loader's workers prepare
  minibatches in parallel with the step, so preparation stalls the step only when ``prep_cpu /
  n`` exceeds it. Preparation scales with the CPUs ``n`` (as many workers as CPUs; workers
  beyond the cores do not help, which is why ``n`` counts CPUs, not workers);
- ``fetch``: the stall per minibatch that reading from storage adds when nothing is cached,
  as measured (storage bound: it does not change with ``n``);
- ``h(c)``: the fraction of items a MinIO cache of ``c`` bytes serves, exactly its share of
  the dataset (MinIO's hits per epoch equal its capacity). Fetching falls with what is not
  cached, in proportion.

At the measured CPU count and no cache the model predicts ``max(compute, prep) + fetch``; the
measured cold time differs from that by how imperfectly preparation overlaps the step (the
measured cached time minus ``max(compute, prep)``: on a small host the step's threads and the
workers compete for the cores). `analyze.render` prints that residual beside the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StallProfile:
    """The measured rates the model extrapolates from (seconds per minibatch, bytes)."""

    compute_s: float
    prep_cpu_s: float
    fetch_s: float
    batches_per_epoch: int
    dataset_bytes: float

    def __post_init__(self) -> None:
        if min(self.compute_s, self.prep_cpu_s, self.fetch_s, self.dataset_bytes) < 0:
            raise ValueError(f"a stall profile has no negative figures: {self}")

    def cached_fraction(self, cache_bytes: float) -> float:
        """MinIO's hit fraction with a cache of `cache_bytes`."""
        if self.dataset_bytes == 0:
            return 1.0
        return min(1.0, max(0.0, cache_bytes) / self.dataset_bytes)

    def batch_s(self, cpus: int, cache_bytes: float = 0.0) -> float:
        """Predicted seconds per minibatch with `cpus` CPUs preparing data and a MinIO cache
        of `cache_bytes` (see the module docstring)."""
        if cpus < 1:
            raise ValueError(f"at least one CPU prepares data, not {cpus}")
        uncached = 1.0 - self.cached_fraction(cache_bytes)
        return max(self.compute_s, self.prep_cpu_s / cpus) + uncached * self.fetch_s

    def epoch_s(self, cpus: int, cache_bytes: float = 0.0) -> float:
        """Predicted seconds per epoch; see `batch_s`."""
        return self.batches_per_epoch * self.batch_s(cpus, cache_bytes)

    def stalls(self, cpus: int, cache_bytes: float = 0.0) -> tuple[float, float]:
        """Predicted (prep, fetch) stall seconds per epoch: time beyond the compute."""
        prep = max(0.0, self.prep_cpu_s / cpus - self.compute_s)
        fetch = (1.0 - self.cached_fraction(cache_bytes)) * self.fetch_s
        return self.batches_per_epoch * prep, self.batches_per_epoch * fetch
