"""The moving window behind the cluster subscription ratio (docs/notebookos.md).

NotebookOS divides the GPUs replicas subscribe (demand) by the GPUs running cells hold (busy),
each averaged over a moving window. The gateway and the simulator both sample the fleet at a
fixed interval into a `UsageWindow` and hand its averages to the policies in the snapshot
(``FleetSnapshot.demand_gpus`` and ``busy_gpus``).
"""

from __future__ import annotations

from collections import deque


class UsageWindow:
    """The averages of the last `size` samples of (demand GPUs, busy GPUs); 0 before any."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a usage window needs at least 1 sample, not {size}")
        self._samples: deque[tuple[float, float]] = deque(maxlen=size)

    @classmethod
    def spanning(cls, window_s: float, interval_s: float) -> UsageWindow:
        """A window of `window_s` seconds sampled every `interval_s` seconds."""
        return cls(max(1, round(window_s / interval_s)))

    def add(self, demand: float, busy: float) -> None:
        self._samples.append((demand, busy))

    @property
    def demand(self) -> float:
        return sum(d for d, _ in self._samples) / len(self._samples) if self._samples else 0.0

    @property
    def busy(self) -> float:
        return sum(b for _, b in self._samples) / len(self._samples) if self._samples else 0.0
