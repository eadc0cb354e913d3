"""Online profiling: iteration time, snapshot cost, persist cost, and what checkpointing stalled.

The profiler only does arithmetic on the times it is given, read from an injected `clock`
(``time.perf_counter`` in a kernel, a fake one in tests). The training loop's thread calls
`iteration` at every step boundary and `stalled` for the time it spent on checkpointing;
the checkpoint's own threads report `snapshot` and `persist` durations.

- ``iter_s``: a step's compute time, the time between two step boundaries less the stall in it,
  averaged over the last `window` steps;
- ``snapshot_s`` / ``persist_s``: the last checkpoint's staging (copy of the state) and persist
  (write, fsync, rename) times;
- ``stall_s``: what the last checkpoint cost the loop (capture, waiting at the snapshot guard);
Only time between two step boundaries counts: `pause` (a cell ended) makes the next boundary
start afresh, so the time a notebook sits between cells is neither an iteration nor overhead.

- `overhead_since`: stalled time over training time since a mark;
- `slowdown_since`: what a cycle cost in all, stalls and the background threads' competition
  for the cores alike: its training time less its steps at the quiet iteration time
  (``quiet_iter_s``: steps with no checkpoint in flight), as a fraction and in seconds. On a
  machine whose cores the loop fills it is larger than the stall, since the snapshot and persist
  threads take cores from it; it also follows any change of the machine's load, so it is shown,
  not tuned on (the bound is on the stall).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Profiler:
    """Running measurements of one training loop (see the module docstring). Thread-safe."""

    clock: Callable[[], float] = time.perf_counter
    window: int = 20
    snapshot_s: float | None = None
    persist_s: float | None = None
    stall_s: float | None = None
    steps: int = 0
    _iters: deque[float] = field(default_factory=deque)
    _quiet: deque[float] = field(default_factory=deque)
    _last_boundary: float | None = None
    _stall_in_step: float = 0.0
    _stall_total: float = 0.0
    _active: float = 0.0
    _intervals: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return self.clock()

    def iteration(self, quiet: bool = False) -> None:
        """A step boundary (after an optimizer step, or `CheckFreq.step`); `quiet`: no
        checkpoint was in flight during the step."""
        now = self.clock()
        with self._lock:
            if self._last_boundary is not None:
                self._active += now - self._last_boundary
                self._intervals += 1
                compute = max(now - self._last_boundary - self._stall_in_step, 0.0)
                kept = [self._iters, self._quiet] if quiet and not self._stall_in_step else [
                    self._iters
                ]  # fmt: skip
                for times in kept:
                    times.append(compute)
                    while len(times) > self.window:
                        times.popleft()
            self._last_boundary = now
            self._stall_in_step = 0.0
            self.steps += 1

    def pause(self) -> None:
        """The loop stopped (a cell ended): the time until its next step boundary is not
        training time."""
        with self._lock:
            self._last_boundary = None
            self._stall_in_step = 0.0

    def stalled(self, seconds: float) -> None:
        """The loop spent `seconds` on checkpointing (in the step now running)."""
        with self._lock:
            self._stall_in_step += seconds
            self._stall_total += seconds

    def checkpoint_stall(self, seconds: float) -> None:
        """The whole stall of the last checkpoint (for the tuner)."""
        with self._lock:
            self.stall_s = seconds

    def snapshot(self, seconds: float) -> None:
        with self._lock:
            self.snapshot_s = seconds

    def persist(self, seconds: float) -> None:
        with self._lock:
            self.persist_s = seconds

    @property
    def iter_s(self) -> float | None:
        """Mean compute time of the last `window` steps; None before two boundaries."""
        with self._lock:
            return sum(self._iters) / len(self._iters) if self._iters else None

    @property
    def quiet_iter_s(self) -> float | None:
        """Mean compute time of the last `window` steps run with no checkpoint in flight."""
        with self._lock:
            return sum(self._quiet) / len(self._quiet) if self._quiet else None

    def mark(self) -> tuple[float, float, int]:
        """A point to measure overhead from: (training time, stalled time, intervals) so far."""
        with self._lock:
            return self._active, self._stall_total, self._intervals

    def overhead_since(self, mark: tuple[float, float, int]) -> float:
        """The fraction of training time since `mark` the loop spent stalled by checkpointing."""
        active_then, stalled_then, _ = mark
        with self._lock:
            elapsed = self._active - active_then
            stalled = self._stall_total - stalled_then
        return min(stalled / elapsed, 1.0) if elapsed > 0 else 0.0

    def slowdown_since(self, mark: tuple[float, float, int]) -> tuple[float, float]:
        """(fraction, seconds): the training time since `mark` beyond its steps at the quiet
        iteration time. Without a quiet measurement yet, the stall alone."""
        quiet = self.quiet_iter_s
        active_then, stalled_then, intervals_then = mark
        with self._lock:
            elapsed = self._active - active_then
            extra = (
                self._stall_total - stalled_then
                if quiet is None
                else max(elapsed - (self._intervals - intervals_then) * quiet, 0.0)
            )
        return (min(extra / elapsed, 1.0) if elapsed > 0 else 0.0), extra

    @property
    def overhead(self) -> float:
        """`overhead_since` the first step."""
        return self.overhead_since((0.0, 0.0, 0))
