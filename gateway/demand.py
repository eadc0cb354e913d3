"""The demand model live (docs/economics.md): the gateway counts cells as they are submitted and
end, the autoscaler observes busy GPUs and kernels every round, and the prediction goes into the
snapshot the autoscaling rule reads (``FleetSnapshot.predicted_gpus``).

The clock is UTC wall time (`time.time`): the model's time-of-day features were learnt on a
trace's clock whose minute 0 is taken as midnight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.scheduler.demand_model import DemandModel, Forecaster


class LiveDemand:
    """A `Forecaster` on the wall clock, fed by the executor chooser (`cell_submitted`,
    `cell_ended`) and the autoscaler (`predicted_gpus`); `sessions` counts the kernels alive."""

    def __init__(
        self,
        model: DemandModel,
        path: str | Path,
        sessions: Callable[[], int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = str(path)
        self._sessions = sessions
        self._forecaster = Forecaster(model)
        self._clock = clock
        self.latest: float | None = None
        """The last prediction (None until the history covers the model's window)."""

    @property
    def model(self) -> DemandModel:
        return self._forecaster.model

    def cell_submitted(self, gpus: int) -> None:
        """A cell asking for `gpus` GPUs was submitted (before it waits or runs)."""
        self._forecaster.arrival(self._clock(), gpus)

    def cell_ended(self, gpus: int) -> None:
        """A cell released its `gpus` GPUs."""
        self._forecaster.end(self._clock(), gpus)

    def predicted_gpus(self, busy: float) -> float | None:
        """Observe the busy GPUs and the kernels alive now; the prediction of this step."""
        self._forecaster.observe(self._clock(), busy, self._sessions())
        self.latest = self._forecaster.predicted_gpus()
        return self.latest

    def describe(self) -> dict[str, Any]:
        """What the admin API shows of the model (under ``autoscaling``)."""
        model = self.model
        return {
            "file": self.path,
            "horizon_s": model.horizon_s,
            "step_s": model.step_s,
            "margin_gpus": model.margin_gpus,
            "quantile": model.quantile,
            "trained": model.trained,
            "predicted_gpus": self.latest,
        }
