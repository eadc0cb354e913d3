"""Jobs whose batch size changes while they train, and what Shockwave predicts about them.

Shockwave's (NSDI'23) trace has three kinds of job (the trace's ``mode`` column):

- ``static`` keeps the batch size its job type names;
- ``gns`` (gradient-noise-scale scaling) doubles its batch size at fixed epochs, never shrinking it,
  up to the model's largest profiled batch size;
- ``accordion`` switches between its initial batch size, inside the model's *critical regimes*
  (epochs where a large batch would hurt accuracy), and the model's largest batch size outside them.

The epochs and batch sizes below are the facts of Shockwave's simulator (its
``_simulate_gns`` / ``_simulate_accordion`` and the batch-size patterns it reads them from); the
code is this project's. A job of ``total_steps`` steps at its initial batch size ``b0`` runs
``ceil(total_steps / ceil(D / b0))`` epochs over a data set of ``D`` samples; an epoch at batch
size ``b`` is ``ceil(D / b)`` steps, taken at the throughput table's figure for batch size ``b``.
Shockwave keeps the number of epochs when the batch size changes and rescales the steps, so the
natural unit of progress is the epoch. `DynamicThroughput` keeps the caller's unit instead, the
*trace step* (``ceil(D / b0)`` of them per epoch, whatever the batch size), so a simulator that
counts progress against ``total_steps`` needs no change: at batch size ``b`` the job makes
``steps_per_s(b) * ceil(D / b0) / ceil(D / b)`` trace steps per second.

Where this model is coarser than Shockwave's simulator (both within one round of a job's run):
Shockwave applies a batch-size change at the end of the next round the job runs, and rounds a job's
progress up to a whole epoch at each change; here the batch size follows the epoch the job is in,
sampled by the simulator at the start of each round.

Shockwave also pre-generates a *profile* of every job (`profiled_batch_sizes`, `profiled_alone_s`),
which its planner reads and its finish-time fairness divides by; the profile follows slightly
different rules from its simulator's (see `profiled_batch_sizes`).

`BatchSizePosterior` is Shockwave's Dirichlet posterior over a job's batch-size regimes: how much of
its remaining work a job will spend at each batch size, from the epochs seen so far.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kernelfleet.scheduler.jobs.simulator import SimulatedJob
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable, ThroughputTableError
from kernelfleet.scheduler.jobs.traces import TraceJob

DATASET_SAMPLES: Mapping[str, int] = {
    "ResNet-18": 50_000,  # CIFAR-10
    "ResNet-50": 100_000,  # ImageNet, as Shockwave's simulator sizes it
    "Transformer": 10_000,  # Multi30k
    "LM": 59_675,  # WikiText-2
    "Recommendation": 117_907,  # ML-20M
    "CycleGAN": 6_287,  # monet2photo
    "A3C": 4,  # no data set
}
"""Samples per epoch of each model's data set (Shockwave's simulator)."""

LARGEST_BATCH_SIZE: Mapping[str, int] = {
    "ResNet-18": 256,
    "ResNet-50": 128,
    "Transformer": 128,
    "LM": 80,
    "Recommendation": 8192,
}
"""The batch size a dynamic job of each model grows to at most (the largest profiled that fits)."""

ACCORDION_MODELS = frozenset({"ResNet-18", "ResNet-50", "LM", "Recommendation"})
"""Models Accordion scales (Shockwave leaves Transformer, CycleGAN and A3C jobs static)."""

GNS_DOUBLINGS: Mapping[tuple[str, int, int], tuple[tuple[int, int], ...]] = {
    # (model, initial batch size, GPUs): ((first epoch, batch-size multiplier), ...)
    ("ResNet-18", 16, 1): ((31, 2), (41, 4), (51, 8), (71, 16)),
    ("ResNet-18", 32, 1): ((21, 2), (31, 4), (51, 8)),
    ("ResNet-18", 64, 1): ((11, 2), (31, 4)),
    ("ResNet-18", 128, 1): ((11, 2),),
    ("ResNet-18", 16, 2): ((21, 2), (31, 4), (91, 8), (111, 16)),
    ("ResNet-18", 32, 2): ((11, 2), (21, 4), (41, 8)),
    ("ResNet-18", 64, 2): ((21, 2), (41, 4)),
    ("ResNet-18", 128, 2): ((41, 2),),
    ("ResNet-18", 16, 4): ((11, 2), (21, 4), (81, 8), (91, 16)),
    ("ResNet-18", 32, 4): ((21, 2), (31, 4), (61, 8)),
    ("ResNet-18", 64, 4): ((11, 2), (61, 4)),
    ("ResNet-18", 128, 4): ((11, 2),),
    ("ResNet-50", 64, 1): ((101, 2),),
    ("ResNet-50", 32, 2): ((101, 2), (111, 4)),
    ("ResNet-50", 64, 2): ((81, 2),),
    ("ResNet-50", 32, 4): ((131, 2), (221, 4)),
    ("ResNet-50", 64, 4): ((191, 2),),
    ("LM", 5, 1): ((31, 2), (41, 4), (61, 8), (71, 16)),
    ("LM", 10, 1): ((11, 2), (21, 4), (41, 8)),
    ("LM", 20, 1): ((11, 2), (41, 4)),
    ("LM", 40, 1): ((11, 2),),
    ("LM", 5, 2): ((31, 2), (51, 4), (61, 8), (71, 16)),
    ("LM", 10, 2): ((11, 2), (31, 4), (41, 8)),
    ("LM", 20, 2): ((31, 2), (41, 4)),
    ("LM", 40, 2): ((11, 2),),
    ("LM", 5, 4): ((11, 2), (31, 4), (71, 8), (91, 16)),
    ("LM", 10, 4): ((11, 2), (31, 4), (61, 8)),
    ("LM", 20, 4): ((11, 2), (61, 4)),
    ("LM", 40, 4): ((61, 2),),
    ("Recommendation", 512, 1): ((21, 2), (41, 4), (71, 8), (91, 16)),
    ("Recommendation", 1024, 1): ((21, 2), (51, 4), (91, 8)),
    ("Recommendation", 2048, 1): ((21, 2), (41, 4)),
    ("Recommendation", 4096, 1): ((41, 2),),
}
"""GNS's batch-size pattern: from each listed epoch on, the initial batch size times the multiplier
(capped at `LARGEST_BATCH_SIZE`). A combination not listed keeps its batch size."""

MODES = ("static", "gns", "accordion")

IsolatedThroughputs = Callable[[str, int], Mapping[str, float] | None]
"""``(job type, GPUs) -> {GPU type: steps/s}`` from a throughput table, None where it has no row."""


def parse_job_type(job_type: str) -> tuple[str, int | None]:
    """``"ResNet-18 (batch size 32)"`` -> ``("ResNet-18", 32)``; a type naming no batch size
    (``"A3C"``) -> ``(job_type, None)``."""
    head, marker, tail = job_type.partition(" (batch size ")
    if not marker or not tail.endswith(")") or not tail[:-1].isdigit():
        return job_type, None
    return head, int(tail[:-1])


def job_type_name(model: str, batch_size: int) -> str:
    return f"{model} (batch size {batch_size})"


def steps_per_epoch(model: str, batch_size: int) -> int:
    return math.ceil(DATASET_SAMPLES[model] / batch_size)


def epoch_counter(epoch_progress: float) -> int:
    """Shockwave's epoch counter: ``ceil`` of the epochs done, so 1 as soon as epoch 0 began."""
    return math.ceil(epoch_progress - 1e-9)


def in_critical_regime(model: str, initial_batch_size: int, counter: int) -> bool:
    """Whether Accordion keeps a job at its initial (small) batch size at this epoch counter."""
    if model == "LM":
        return counter < 10
    if model == "Recommendation":
        head = {512: 30, 1024: 30, 2048: 40}.get(initial_batch_size, 10)
        return counter < head
    if model == "ResNet-50":
        return counter % 30 < 10
    if model == "ResNet-18":
        head = 20 if initial_batch_size == 256 else 10
        return counter < head or 150 <= counter < 160 or 250 <= counter < 260
    return True


def scheduled_batch_size(
    mode: str, model: str, initial_batch_size: int, gpus: int, epoch_progress: float
) -> int:
    """The batch size Shockwave's simulator drives a job to once it has done `epoch_progress` epochs
    (before checking that the throughput table has that batch size: see `DynamicThroughput`).

    GNS looks one epoch ahead (it grows as soon as the next epoch's pattern is larger), Accordion
    looks at the current epoch counter; a job starting at its model's largest batch size keeps it.
    """
    if mode not in MODES:
        raise ValueError(f"unknown batch-size mode {mode!r} (known: {', '.join(MODES)})")
    largest = LARGEST_BATCH_SIZE.get(model)
    if mode == "static" or largest is None or initial_batch_size >= largest:
        return initial_batch_size
    counter = epoch_counter(epoch_progress)
    if mode == "gns":
        multiplier = 1
        for first_epoch, factor in GNS_DOUBLINGS.get((model, initial_batch_size, gpus), ()):
            if counter + 1 >= first_epoch:
                multiplier = factor
        return min(initial_batch_size * multiplier, largest)
    if model not in ACCORDION_MODELS or in_critical_regime(model, initial_batch_size, counter):
        return initial_batch_size
    return largest


PROFILE_WARM_UP_SHARE = 0.3
"""Accordion keeps a job's initial batch size for this share of its epochs in Shockwave's profiles
(not in its simulator: see `profiled_batch_sizes`)."""

RECOMMENDATION_LATE_REGIMES = ((60, 70), (80, 90))
"""Critical regimes of Recommendation jobs in Shockwave's profiles (its simulator lacks them)."""


def profiled_batch_sizes(
    mode: str, model: str, initial_batch_size: int, gpus: int, epochs: int
) -> tuple[int, ...]:
    """The batch size of each epoch in the profile Shockwave pre-generates for a job (its
    ``generate_pickle_file`` with ``get_accordion_bs_pattern`` / ``get_gns_bs_pattern``). Its
    planner reads that profile and its finish-time fairness divides by the profile's duration, but
    its simulator drives the job by other rules (`scheduled_batch_size`). They differ in three
    ways: an Accordion profile keeps the initial batch size for the first 30 % of the epochs and
    in two more Recommendation regimes; a GNS profile doubles at the pattern's epochs themselves
    (the simulator looks one epoch ahead) and keeps the initial batch size in the last epoch
    unless that lies in the first doubling's range."""
    if mode not in MODES:
        raise ValueError(f"unknown batch-size mode {mode!r} (known: {', '.join(MODES)})")
    largest = LARGEST_BATCH_SIZE.get(model, initial_batch_size)
    if mode == "accordion" and model in ACCORDION_MODELS:
        return tuple(
            largest
            if epoch > epochs * PROFILE_WARM_UP_SHARE
            and not in_critical_regime(model, initial_batch_size, epoch)
            and not (
                model == "Recommendation"
                and any(low <= epoch < high for low, high in RECOMMENDATION_LATE_REGIMES)
            )
            else initial_batch_size
            for epoch in range(epochs)
        )
    doublings = GNS_DOUBLINGS.get((model, initial_batch_size, gpus), ()) if mode == "gns" else ()
    sizes = []
    for epoch in range(epochs):
        multiplier = 1
        for first_epoch, factor in doublings:
            if epoch >= first_epoch:
                multiplier = factor
        last_in_later_range = len(doublings) > 1 and epoch >= doublings[1][0]
        if epoch == epochs - 1 and last_in_later_range:
            multiplier = 1
        sizes.append(min(initial_batch_size * multiplier, max(largest, initial_batch_size)))
    return tuple(sizes)


def profiled_alone_s(
    mode: str,
    model: str,
    initial_batch_size: int,
    gpus: int,
    epochs: int,
    isolated: IsolatedThroughputs,
) -> dict[str, float]:
    """Seconds a job takes alone by Shockwave's profile, per GPU type: each profiled epoch at
    ``samples / batch size`` iterations (not rounded up, as the profile has it) at the throughput
    table's figure. Empty where the table lacks a batch size of the profile."""
    seconds: dict[str, float] = {}
    for batch_size, count in Counter(
        profiled_batch_sizes(mode, model, initial_batch_size, gpus, epochs)
    ).items():
        row = isolated(job_type_name(model, batch_size), gpus)
        if row is None:
            return {}
        iterations = DATASET_SAMPLES[model] / batch_size * count
        for gpu, rate in row.items():
            if rate > 0.0:
                seconds[gpu] = seconds.get(gpu, 0.0) + iterations / rate
    return seconds


@dataclass(frozen=True)
class DynamicThroughput:
    """A job's speed and batch size as it trains: the simulator's throughput model for one job.

    Progress (``steps_done``) is counted in trace steps: steps at the initial batch size, as
    ``total_steps`` is. ``rates`` holds, for every batch size the job may reach, its trace steps per
    second on each GPU type (a batch size the throughput table lacks is one the job never moves to:
    Shockwave's simulator refuses such a change and keeps the batch size it had).
    """

    model: str
    initial_batch_size: int | None
    """None for a job type that names no batch size (A3C, CycleGAN): it keeps ``rates[0]``."""
    gpus: int
    total_steps: int
    mode: str
    rates: Mapping[int, Mapping[str, float]]
    profiled_alone_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds alone per GPU type by Shockwave's profile (`profiled_alone_s`); empty if unknown."""

    @classmethod
    def build(
        cls,
        job_type: str,
        gpus: int,
        total_steps: int,
        mode: str,
        isolated: IsolatedThroughputs,
    ) -> DynamicThroughput:
        """The model of one trace job, reading throughputs through `isolated` (a throughput table).

        Raises `ValueError` for a job type naming no batch size or a model of unknown data-set size
        when `mode` is dynamic, and when the table has no row for the job's own type.
        """
        model, initial = parse_job_type(job_type)
        own = isolated(job_type, gpus)
        if own is None:
            raise ValueError(f"the throughput table has no row for ({job_type!r}, {gpus})")
        if initial is None or model not in DATASET_SAMPLES:
            if mode != "static":
                raise ValueError(f"{job_type!r} cannot change its batch size (mode {mode!r})")
            return cls(job_type, None, gpus, total_steps, "static", {0: dict(own)})
        rates: dict[int, Mapping[str, float]] = {initial: dict(own)}
        trace_steps_per_epoch = steps_per_epoch(model, initial)
        candidates = {initial, LARGEST_BATCH_SIZE.get(model, initial)}
        candidates |= {
            initial * factor for _, factor in GNS_DOUBLINGS.get((model, initial, gpus), ())
        }
        for batch_size in sorted(candidates - {initial}):
            row = isolated(job_type_name(model, batch_size), gpus)
            if row is not None:
                scale = trace_steps_per_epoch / steps_per_epoch(model, batch_size)
                rates[batch_size] = {gpu: rate * scale for gpu, rate in row.items()}
        epochs = max(math.ceil(total_steps / trace_steps_per_epoch), 1)
        profile = profiled_alone_s(mode, model, initial, gpus, epochs, isolated)
        return cls(model, initial, gpus, total_steps, mode, rates, profile)

    @property
    def trace_steps_per_epoch(self) -> int:
        if self.initial_batch_size is None or self.model not in DATASET_SAMPLES:
            return max(self.total_steps, 1)
        return steps_per_epoch(self.model, self.initial_batch_size)

    @property
    def epochs(self) -> int:
        return max(math.ceil(self.total_steps / self.trace_steps_per_epoch), 1)

    def epoch_progress(self, steps_done: float) -> float:
        return steps_done / self.trace_steps_per_epoch

    def batch_size(self, steps_done: float) -> int | None:
        if self.initial_batch_size is None:
            return None
        return self._batch_size(self.initial_batch_size, steps_done)

    def _batch_size(self, initial: int, steps_done: float) -> int:
        wanted = scheduled_batch_size(
            self.mode,
            self.model,
            initial,
            self.gpus,
            self.epoch_progress(steps_done),
        )
        if wanted in self.rates:
            return wanted
        # GNS grows by doubling: it stops at the last batch size the table has.
        reachable = initial
        while self.mode == "gns" and reachable * 2 <= wanted and reachable * 2 in self.rates:
            reachable *= 2
        return reachable

    def steps_per_s(self, gpu_type: str, steps_done: float) -> float:
        return self.rates[self.batch_size(steps_done) or 0].get(gpu_type, 0.0)

    def regimes(self) -> tuple[int, ...]:
        """The batch sizes this job passes through over its whole run, ascending: the support of
        the posterior's prior (Shockwave knows each job's possible batch sizes in advance)."""
        seen = {
            self.batch_size(epoch * self.trace_steps_per_epoch) or 0 for epoch in range(self.epochs)
        }
        return tuple(sorted(seen))

    def regime_throughputs(self) -> dict[int, Mapping[str, float]]:
        """What a `JobView` carries for Shockwave's posterior: trace steps/s per GPU type at each
        batch size of `regimes` (0 for a job type that names no batch size)."""
        return {size: self.rates[size] for size in self.regimes()}


@dataclass
class BatchSizePosterior:
    """Shockwave's Dirichlet posterior over the batch-size regimes of one job.

    The prior spreads the job's ``epochs`` evenly over its possible batch sizes (concentration
    ``epochs / len(regimes)`` each); every epoch seen at a batch size adds 1 to that size's
    concentration. The posterior mean, scaled to the job's epochs, less the epochs already seen
    at each size, says how many of the remaining epochs the job should spend at each batch size.
    Observations are kept per epoch index, so seeing the same epoch twice counts once.
    """

    regimes: tuple[int, ...]
    epochs: int
    seen: dict[int, int] = field(default_factory=dict)
    """epoch index -> the batch size observed during it."""

    def __post_init__(self) -> None:
        if not self.regimes:
            raise ValueError("a posterior needs at least one batch-size regime")
        if self.epochs < 1:
            raise ValueError(f"a job runs at least one epoch, not {self.epochs}")

    def observe(self, epoch_progress: float, batch_size: int) -> None:
        """Record the batch size the job trains at now; epochs skipped since the last observation
        (a job that ran several epochs in one round) are taken to have had the same batch size."""
        current = min(int(epoch_progress), self.epochs - 1)
        start = max(self.seen, default=-1) + 1
        for epoch in range(start, current + 1):
            self.seen[epoch] = batch_size
        self.seen[current] = batch_size
        if batch_size not in self.regimes:
            self.regimes = tuple(sorted({*self.regimes, batch_size}))

    def concentrations(self) -> dict[int, float]:
        prior = self.epochs / len(self.regimes)
        counts = Counter(self.seen.values())
        return {size: prior + counts[size] for size in self.regimes}

    def remaining_shares(self) -> dict[int, float]:
        """For each batch size, the expected share of the job's remaining epochs spent at it."""
        concentrations = self.concentrations()
        total = sum(concentrations.values())
        counts = Counter(self.seen.values())
        remaining = {
            size: max(self.epochs * alpha / total - counts[size], 0.0)
            for size, alpha in concentrations.items()
        }
        mass = sum(remaining.values())
        if mass <= 0.0:  # every regime used up its expected epochs: the latest one continues
            latest = self.seen[max(self.seen)] if self.seen else self.regimes[0]
            return {size: float(size == latest) for size in self.regimes}
        return {size: share / mass for size, share in remaining.items()}

    def remaining_time(self, steps_left: float, rate_at: Mapping[int, float]) -> float:
        """Expected seconds to do `steps_left` trace steps: each regime's share of them at that
        regime's rate (trace steps/s). A regime with no rate takes the slowest known one's."""
        known = [rate for rate in rate_at.values() if rate > 0.0]
        if steps_left <= 0.0:
            return 0.0
        if not known:
            return math.inf
        slowest = min(known)
        return sum(
            steps_left * share / (rate_at.get(size, 0.0) or slowest)
            for size, share in self.remaining_shares().items()
        )


def table_lookup(table: ThroughputTable, gpu_types: Iterable[str]) -> IsolatedThroughputs:
    """`IsolatedThroughputs` over a `ThroughputTable`, on ``gpu_types`` (None for a missing row)."""
    types = tuple(gpu_types)

    def isolated(job_type: str, gpus: int) -> Mapping[str, float] | None:
        try:
            return table.throughputs_for(job_type, gpus, types)
        except ThroughputTableError:
            return None

    return isolated


def dynamic_jobs_from_trace(
    trace: Iterable[TraceJob],
    table: ThroughputTable,
    gpu_types: Iterable[str],
    *,
    alone_from_profile: bool = False,
) -> list[SimulatedJob]:
    """Simulated jobs ``job-<line>`` whose batch size follows their trace ``mode`` (Shockwave's
    dynamic traces); the counterpart of the simulator's static `jobs_from_trace`.

    ``alone_from_profile`` makes finish-time fairness divide by the job's time alone by Shockwave's
    profile (`profiled_alone_s`, on its fastest GPU type), as Shockwave's simulator reports it,
    rather than by the time its own dynamics take alone."""
    lookup = table_lookup(table, gpu_types)
    jobs = []
    for entry in trace:
        model = DynamicThroughput.build(
            entry.job_type, entry.scale_factor, entry.total_steps, entry.mode, lookup
        )
        profiled = model.profiled_alone_s
        jobs.append(
            SimulatedJob(
                job_id=f"job-{entry.line}",
                job_type=entry.job_type,
                scale_factor=entry.scale_factor,
                total_steps=entry.total_steps,
                arrival_s=entry.arrival_s,
                model=model,
                priority_weight=entry.priority_weight,
                mode=entry.mode,
                reference_alone_s=min(profiled.values())
                if alone_from_profile and profiled
                else None,
            )
        )
    return jobs
