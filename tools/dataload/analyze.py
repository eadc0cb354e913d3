"""DS-Analyzer's differential measurement: where a training loop waits for data.

`analyze(loader, model, batches=N)` runs the same N minibatches (the loader's first N, in its
own order) four ways, timing each from the first minibatch's arrival (worker start-up is left
out) over the N - 1 after it:

1. **cold**: the real loader feeding the model, after dropping the OS page cache where this
   process may (root on a host whose ``/proc/sys/vm/drop_caches`` is writable); elsewhere the
   cache is "as found" and the report says so. Runs first, so nothing has warmed the data.
2. **synthetic**: the model's step on one minibatch held in memory, N times: the rate the
   model can ingest (compute bound).
3. **cached**: the loader over fully cached data feeding the model: decode and transform still
   run in the loader's workers, fetching does not. For a *staged* dataset, one with
   ``fetch(index) -> raw`` and ``prepare(raw) -> item`` (and ``dataset[i] ==
   prepare(fetch(i))``), the raw items are read into memory first; for any other dataset the
   cold pass has warmed the page cache and the same indices are read again.
4. **prep only**: the loader over the cached data alone, no model: the preparation rate.

Then, per minibatch: prep stall = cached - synthetic, fetch stall = cold - cached (each at
least 0); their fractions are of the cold time. The CPU-seconds of preparation per minibatch
are the prep-only time times the CPUs that ran it (the workers, at most the cores; 1 for
``num_workers=0``), and `whatif.StallProfile` extrapolates to other CPU counts and cache sizes.

A model's step: a ``torch.nn.Module`` is run forward on the minibatch (its first element when
the minibatch is a tuple or list) and backward from the sum of its output; any other callable is
called with the minibatch and does what it likes (a whole training step, say).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.sizes import format_size
from kernelfleet.tools.dataload.whatif import StallProfile

DROP_CACHES = "/proc/sys/vm/drop_caches"


@dataclass(frozen=True)
class Analysis:
    """What `analyze` measured: seconds per minibatch of each pass, and how it ran them."""

    batches: int
    workers: int
    cpus: int
    cold_s: float
    synthetic_s: float
    cached_s: float
    prep_only_s: float
    cold_mode: str
    cached_mode: str
    batches_per_epoch: int
    dataset_bytes: float

    @property
    def prep_stall_s(self) -> float:
        """Seconds per minibatch the step waits for decode and transform."""
        return max(0.0, self.cached_s - self.synthetic_s)

    @property
    def fetch_stall_s(self) -> float:
        """Seconds per minibatch the step waits for storage."""
        return max(0.0, self.cold_s - self.cached_s)

    @property
    def prep_stall_fraction(self) -> float:
        return self.prep_stall_s / self.cold_s if self.cold_s > 0 else 0.0

    @property
    def fetch_stall_fraction(self) -> float:
        return self.fetch_stall_s / self.cold_s if self.cold_s > 0 else 0.0

    @property
    def profile(self) -> StallProfile:
        """The rates the what-if model extrapolates from."""
        return StallProfile(
            compute_s=self.synthetic_s,
            prep_cpu_s=self.prep_only_s * self.cpus,
            fetch_s=self.fetch_stall_s,
            batches_per_epoch=self.batches_per_epoch,
            dataset_bytes=self.dataset_bytes,
        )


def analyze(
    loader: Any,
    model: Any,
    batches: int = 20,
    *,
    drop_page_cache: bool = True,
    cores: int | None = None,
) -> Analysis:
    """Measure `loader` (a ``torch.utils.data.DataLoader`` over a map-style dataset, batched)
    feeding `model` (see the module docstring) over its first `batches` minibatches, at least
    2. `cores`: the CPUs this process may use (found when None). Raises `InvalidRequest` for a
    loader or model it cannot measure."""
    step = model_step(model)
    batch_lists = _first_batches(loader, batches)
    cores = cores or len(os.sched_getaffinity(0))
    workers = int(loader.num_workers)
    cold_mode = _drop_page_cache() if drop_page_cache else "as found (not asked to drop it)"
    held: list[Any] = []
    cold_s = _timed_pass(_loader_like(loader, loader.dataset, batch_lists), step, keep=held)
    synthetic_s = _timed_steps(step, held[0], batches)
    cached, cached_mode, dataset_bytes = _cached_dataset(loader.dataset, batch_lists, held[0])
    cached_s = _timed_pass(_loader_like(loader, cached, batch_lists), step)
    prep_only_s = _timed_pass(_loader_like(loader, cached, batch_lists), None)
    return Analysis(
        batches=batches,
        workers=workers,
        cpus=max(1, min(workers, cores)),
        cold_s=cold_s,
        synthetic_s=synthetic_s,
        cached_s=cached_s,
        prep_only_s=prep_only_s,
        cold_mode=cold_mode,
        cached_mode=cached_mode,
        batches_per_epoch=len(loader),
        dataset_bytes=dataset_bytes,
    )


def model_step(model: Any) -> Callable[[Any], None]:
    """The step `analyze` times for `model` (see the module docstring)."""
    import torch

    if isinstance(model, torch.nn.Module):

        def module_step(batch: Any) -> None:
            inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
            output = model(inputs)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.float().sum().backward()
                model.zero_grad(set_to_none=True)

        return module_step
    if callable(model):
        return model
    raise InvalidRequest(f"the model must be a torch.nn.Module or a callable, not {model!r}")


def is_staged(dataset: Any) -> bool:
    """Whether `dataset` splits an item into ``fetch(index)`` and ``prepare(raw)``."""
    return callable(getattr(dataset, "fetch", None)) and callable(getattr(dataset, "prepare", None))


class PreparedFromMemory:
    """A staged dataset's items prepared from raw items held in memory (the cached pass)."""

    def __init__(self, dataset: Any, raw: dict[int, Any]) -> None:
        self.dataset = dataset
        self.raw = raw

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset.prepare(self.raw[index])


def render(analysis: Analysis, cpus: Sequence[int], cache_bytes: Sequence[float]) -> str:
    """The measurement and a what-if table of predicted epoch seconds (rows: CPUs, columns:
    MinIO cache sizes), as text."""
    a = analysis
    lines = [
        f"{a.batches} minibatches, {a.workers} loader workers on {a.cpus} CPU(s); "
        f"{a.batches_per_epoch} minibatches per epoch",
        f"  cold      {a.cold_s * 1e3:10.2f} ms/batch   page cache {a.cold_mode}",
        f"  synthetic {a.synthetic_s * 1e3:10.2f} ms/batch   one minibatch held in memory",
        f"  cached    {a.cached_s * 1e3:10.2f} ms/batch   {a.cached_mode}",
        f"  prep only {a.prep_only_s * 1e3:10.2f} ms/batch   the loader alone, cached data",
        f"prep stall  {a.prep_stall_s * 1e3:10.2f} ms/batch  {a.prep_stall_fraction:6.1%} of cold",
        f"fetch stall {a.fetch_stall_s * 1e3:10.2f} ms/batch  {a.fetch_stall_fraction:6.1%} "
        "of cold",
        f"model at the measured point: {a.profile.batch_s(a.cpus) * 1e3:.2f} ms/batch "
        f"predicted, {a.cold_s * 1e3:.2f} measured",
        "",
        f"what-if: predicted epoch seconds (dataset {format_size(a.dataset_bytes)}; "
        "whatif.StallProfile states the model)",
    ]
    header = f"{'CPUs':>6}" + "".join(
        f"{_cache_label(c, a.dataset_bytes):>14}" for c in cache_bytes
    )
    lines += [header, "-" * len(header)]
    for n in cpus:
        cells = "".join(f"{a.profile.epoch_s(n, c):>14.2f}" for c in cache_bytes)
        lines.append(f"{n:>6}{cells}")
    return "\n".join(lines)


def _cache_label(cache_bytes: float, dataset_bytes: float) -> str:
    share = cache_bytes / dataset_bytes if dataset_bytes else 1.0
    return f"cache {min(share, 1.0):.0%}"


def _first_batches(loader: Any, batches: int) -> list[list[int]]:
    if batches < 2:
        raise InvalidRequest(f"measure at least 2 minibatches, not {batches}")
    sampler = getattr(loader, "batch_sampler", None)
    if sampler is None or not hasattr(loader, "num_workers"):
        raise InvalidRequest(
            f"expected a batching torch DataLoader over a map-style dataset, not {loader!r}"
        )
    lists = [list(indices) for indices in islice(iter(sampler), batches)]
    if len(lists) < batches:
        raise InvalidRequest(f"the loader has {len(lists)} minibatches, fewer than {batches}")
    return lists


def _loader_like(loader: Any, dataset: Any, batch_lists: list[list[int]]) -> Any:
    """A loader like `loader` (workers, collation, pinning) over `dataset`, yielding exactly
    the minibatches `batch_lists`."""
    from torch.utils.data import DataLoader

    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra = {
            "prefetch_factor": loader.prefetch_factor,
            "multiprocessing_context": loader.multiprocessing_context,
            "worker_init_fn": loader.worker_init_fn,
        }
    return DataLoader(
        dataset,
        batch_sampler=batch_lists,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        **extra,
    )


def _timed_pass(
    batches: Iterable[Any], step: Callable[[Any], None] | None, keep: list[Any] | None = None
) -> float:
    """Seconds per minibatch over all but the first (start-up excluded); the first minibatch
    goes into `keep` when given."""
    iterator = iter(batches)
    first = next(iterator)
    if keep is not None:
        keep.append(first)
    if step is not None:
        step(first)
    start = time.perf_counter()
    count = 0
    for batch in iterator:
        if step is not None:
            step(batch)
        count += 1
    return (time.perf_counter() - start) / max(count, 1)


def _timed_steps(step: Callable[[Any], None], batch: Any, batches: int) -> float:
    start = time.perf_counter()
    for _ in range(batches - 1):
        step(batch)
    return (time.perf_counter() - start) / (batches - 1)


def _cached_dataset(
    dataset: Any, batch_lists: list[list[int]], first_batch: Any
) -> tuple[Any, str, float]:
    """The dataset for the cached passes, how it is cached, and the whole dataset's bytes as a
    cache would hold them (estimated from the measured items)."""
    indices = [index for indices in batch_lists for index in indices]
    if is_staged(dataset):
        raw = {index: dataset.fetch(index) for index in indices}
        per_item = sum(len(pickle.dumps(r, protocol=5)) for r in raw.values()) / len(raw)
        return PreparedFromMemory(dataset, raw), "raw items in memory", per_item * len(dataset)
    per_item = len(pickle.dumps(first_batch, protocol=5)) / len(batch_lists[0])
    return dataset, "page cache warmed by the cold pass", per_item * len(dataset)


def _drop_page_cache() -> str:
    """Drop the OS page cache if allowed; says what the cold pass found."""
    try:
        os.sync()
        with open(DROP_CACHES, "w") as control:
            control.write("1\n")
    except OSError as error:
        return f"as found (could not drop it: {error.strerror or error})"
    return "dropped"
