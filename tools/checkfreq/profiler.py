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
- `overhead_since`: stalled time over wall time since a mark, the figure the bound is about.
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
    _last_boundary: float | None = None
    _stall_in_step: float = 0.0
    _stall_total: float = 0.0
    _started: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return self.clock()

    def iteration(self) -> None:
        """A step boundary (after an optimizer step, or `CheckFreq.step`)."""
        now = self.clock()
        with self._lock:
            if self._started is None:
                self._started = now
            if self._last_boundary is not None:
                compute = max(now - self._last_boundary - self._stall_in_step, 0.0)
                self._iters.append(compute)
                while len(self._iters) > self.window:
                    self._iters.popleft()
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

    def mark(self) -> tuple[float, float]:
        """A point to measure overhead from: (now, stalled time so far)."""
        with self._lock:
            return self.clock(), self._stall_total

    def overhead_since(self, mark: tuple[float, float]) -> float:
        """The fraction of wall time since `mark` the loop spent stalled by checkpointing."""
        start, stalled_then = mark
        with self._lock:
            elapsed = self.clock() - start
            stalled = self._stall_total - stalled_then
        return stalled / elapsed if elapsed > 0 else 0.0

    @property
    def overhead(self) -> float:
        """The fraction of wall time since the first step spent stalled by checkpointing."""
        with self._lock:
            if self._started is None:
                return 0.0
            elapsed = self.clock() - self._started
            return self._stall_total / elapsed if elapsed > 0 else 0.0
