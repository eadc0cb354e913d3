"""The recent arrivals of cells, which size the autoscaler's warm capacity (`autoscale.py`).

A caller (the simulator's engine; the gateway's `ExecutorChooser`) records each cell as it
is submitted, with its GPU need, and hands `ArrivalWindow.stats` to the policies in the snapshot
(``FleetSnapshot.arrivals``).
"""

from __future__ import annotations

from collections import deque

from kernelfleet.scheduler.snapshot import ArrivalStats


class ArrivalWindow:
    """Cells submitted in the last `window_s` seconds, on the caller's clock (non-decreasing)."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"an arrival window must be longer than 0 s, not {window_s}")
        self.window_s = window_s
        self._cells: deque[tuple[float, int]] = deque()
        self._gpus = 0
        self._gpus_squared = 0
        self._latest: tuple[float, ArrivalStats] | None = None  # stats asked for at a time

    def add(self, now: float, gpus: int) -> None:
        """A cell needing `gpus` GPUs was submitted at `now`. Cells out of the window are
        forgotten here too, so the window stays small however rarely `stats` is asked."""
        self._forget_until(now - self.window_s)
        self._cells.append((now, gpus))
        self._gpus += gpus
        self._gpus_squared += gpus * gpus
        self._latest = None

    def stats(self, now: float) -> ArrivalStats:
        """The cells submitted in ``(now - window_s, now]``."""
        if self._latest is not None and self._latest[0] == now:
            return self._latest[1]
        self._forget_until(now - self.window_s)
        stats = ArrivalStats(self.window_s, len(self._cells), self._gpus, self._gpus_squared)
        self._latest = (now, stats)
        return stats

    def _forget_until(self, horizon: float) -> None:
        cells = self._cells
        while cells and cells[0][0] <= horizon:
            _, gpus = cells.popleft()
            self._gpus -= gpus
            self._gpus_squared -= gpus * gpus
