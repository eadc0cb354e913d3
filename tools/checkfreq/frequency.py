"""How often to checkpoint: CheckFreq's frequency rule, and the tuner that bounds the overhead.

Pure functions and a small object over numbers; no clock, no I/O. Times are seconds.

The rule (CheckFreq, FAST'21): a checkpoint's snapshot overlaps the next iterations' compute and
its persist runs in the background, so the next checkpoint must not come before the persist of the
previous one has ended::

    k = max(ceil((t_persist - t_snapshot) / t_iter), 1)

The tuner adds the bound: each checkpoint stalls training by some time (what the loop waited for:
capturing the state, the snapshot guard, a persist still in flight). Checkpointing every `k`
iterations costs ``stall / (k * t_iter)`` of the training time; when the measured overhead exceeds
`max_overhead`, `k` grows to the smallest interval that keeps it under the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_INTERVAL = 1_000_000
"""The longest interval the tuner chooses (iterations)."""


def checkpoint_interval(iter_s: float, snapshot_s: float, persist_s: float) -> int:
    """CheckFreq's rule: iterations between checkpoints so that one persist ends before the
    next checkpoint starts. At least 1; `iter_s` must be above 0."""
    if iter_s <= 0:
        raise ValueError(f"the iteration time must be above 0, not {iter_s}")
    return min(max(math.ceil((persist_s - snapshot_s) / iter_s), 1), MAX_INTERVAL)


def bounded_interval(iter_s: float, stall_s: float, max_overhead: float) -> int:
    """The fewest iterations between checkpoints whose stall of `stall_s` each keeps the
    overhead at most `max_overhead` (a fraction: 0.05 is 5 %)."""
    if iter_s <= 0 or max_overhead <= 0:
        raise ValueError("the iteration time and the overhead bound must be above 0")
    return min(max(math.ceil(stall_s / (max_overhead * iter_s) - 1e-9), 1), MAX_INTERVAL)


@dataclass(frozen=True)
class Decision:
    """What the tuner chose and why: `interval` iterations between checkpoints, the rule's
    value, and the overhead the measurements predict at that interval."""

    interval: int
    rule_interval: int
    predicted_overhead: float
    retuned: bool


@dataclass
class Tuner:
    """Chooses the checkpoint interval from the profiled times and retunes it when the measured
    overhead exceeds the bound.

    `decide` gives the first interval, after profiling; `observe` is called after each
    checkpoint with the overhead measured since the previous one and returns the interval to
    use next: the same while the overhead stays within `max_overhead`, a larger one (never
    smaller) when it does not."""

    max_overhead: float = 0.05
    interval: int = 0
    retunes: int = 0

    def decide(
        self, iter_s: float, snapshot_s: float, persist_s: float, stall_s: float
    ) -> Decision:
        rule = checkpoint_interval(iter_s, snapshot_s, persist_s)
        self.interval = max(rule, bounded_interval(iter_s, stall_s, self.max_overhead))
        return Decision(self.interval, rule, stall_s / (self.interval * iter_s), False)

    def observe(
        self, measured_overhead: float, iter_s: float, snapshot_s: float, persist_s: float,
        stall_s: float,
    ) -> Decision:  # fmt: skip
        """After a checkpoint: keep the interval while `measured_overhead` is within the bound,
        else grow it to what the latest times need (at least one more than now)."""
        rule = checkpoint_interval(iter_s, snapshot_s, persist_s)
        retuned = False
        if measured_overhead > self.max_overhead:
            needed = max(rule, bounded_interval(iter_s, stall_s, self.max_overhead))
            self.interval = min(max(needed, self.interval + 1), MAX_INTERVAL)
            self.retunes += 1
            retuned = True
        elif rule > self.interval:  # persists got slower: never start one before the last ended
            self.interval = rule
            retuned = True
        return Decision(self.interval, rule, stall_s / (self.interval * iter_s), retuned)
