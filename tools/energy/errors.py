"""The energy tool's errors: each is shown by IPython as one line, ``Name: message``."""

from __future__ import annotations

from kernelfleet.errors import FleetError


class EnergyError(FleetError):
    """Base of the energy tool's errors."""

    reason = "energy-error"

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self.message}"]


class UnknownKnob(EnergyError):
    """A knob the backend cannot turn (the message lists those it can)."""

    reason = "unknown-knob"


class TraceNotFound(EnergyError):
    """The Zeus power tables, or the workload asked for, are not where they were looked for."""

    reason = "trace-not-found"


class NoGpuBound(EnergyError):
    """No GPU is bound to the running cell, so there is nothing to set or measure."""

    reason = "no-gpus-bound"


class SettingRefused(EnergyError):
    """The host refused to change a GPU setting (no permission, a value out of range); the
    host agent left every device as it was."""

    reason = "setting-refused"


class SettingUnavailable(EnergyError):
    """A setting the workload cannot run at (a batch that does not fit, a pair the replay's
    table lacks): the tuner records it as failed and moves on."""

    reason = "setting-unavailable"
