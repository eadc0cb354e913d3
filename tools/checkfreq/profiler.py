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
- `overhead_since`: stalled time over wall time since a mark;
- `slowdown_since`: what a cycle cost in all, stalls and the background threads' competition
  for the cores alike: its wall time less its steps at the quiet iteration time (``quiet_iter_s``:
  steps with no checkpoint in flight), as a fraction of its wall time and in seconds. This is
  the figure the bound is about; on a machine whose cores the training loop fills, it is larger
  than the stall alone, since the snapshot and persist threads take cores from it.
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
    _started: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return self.clock()

    def iteration(self, quiet: bool = False) -> None:
        """A step boundary (after an optimizer step, or `CheckFreq.step`); `quiet`: no
        checkpoint was in flight during the step."""
        now = self.clock()
        with self._lock:
            if self._started is None:
                self._started = now
            if self._last_boundary is not None:
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
        """A point to measure overhead from: (now, stalled time so far, steps so far)."""
        with self._lock:
            return self.clock(), self._stall_total, self.steps

    def overhead_since(self, mark: tuple[float, float, int]) -> float:
        """The fraction of wall time since `mark` the loop spent stalled by checkpointing."""
        start, stalled_then, _ = mark
        with self._lock:
            elapsed = self.clock() - start
            stalled = self._stall_total - stalled_then
        return stalled / elapsed if elapsed > 0 else 0.0

    def slowdown_since(self, mark: tuple[float, float, int]) -> tuple[float, float]:
        """(fraction, seconds): the wall time since `mark` beyond its steps at the quiet
        iteration time. Without a quiet measurement yet, the stall alone."""
        quiet = self.quiet_iter_s
        start, stalled_then, steps_then = mark
        with self._lock:
            elapsed = self.clock() - start
            extra = (
                self._stall_total - stalled_then
                if quiet is None
                else max(elapsed - (self.steps - steps_then) * quiet, 0.0)
            )
        return (extra / elapsed if elapsed > 0 else 0.0), extra

    @property
    def overhead(self) -> float:
        """The fraction of wall time since the first step spent stalled by checkpointing."""
        with self._lock:
            if self._started is None:
                return 0.0
            elapsed = self.clock() - self._started
            return self._stall_total / elapsed if elapsed > 0 else 0.0
