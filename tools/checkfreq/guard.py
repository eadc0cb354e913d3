"""The snapshot guard: no optimizer step while a snapshot is still copying the weights.

A checkpoint's snapshot (staging: copying the parameters and the optimizer's state out of the
training objects) runs in the background, overlapping the next iteration's forward and backward
passes, which read the weights but do not change them. The next ``optimizer.step`` does, so it
must wait for the copy to end: `pass_through` is called right before every step and blocks until
the snapshot in flight (if any) is done. The training loop stalls only when the copy takes longer
than a forward and backward pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any


class SnapshotGuard:
    """Holds the snapshot in flight (one at most) and makes the next step wait for it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: Future[Any] | None = None

    def hold(self, snapshot: Future[Any]) -> None:
        """`snapshot` is copying the weights: the next step waits for it."""
        with self._lock:
            if self._snapshot is not None and not self._snapshot.done():
                raise RuntimeError("a snapshot is already in flight")
            self._snapshot = snapshot

    @property
    def holding(self) -> bool:
        with self._lock:
            return self._snapshot is not None and not self._snapshot.done()

    def pass_through(self) -> float:
        """Block until the snapshot in flight (if any) has ended, successfully or not; return the
        seconds waited. The snapshot's own outcome is its future's to report."""
        with self._lock:
            snapshot, self._snapshot = self._snapshot, None
        if snapshot is None or snapshot.done():
            return 0.0
        start = self._clock()
        wait([snapshot])  # its outcome is reported by whoever waits on the checkpoint
        return self._clock() - start
