"""`FleetBackend`: the tuner on the real GPUs bound to the running cell.

Clocks and power limits need root, which a notebook never has: the backend asks the host agent
through the gateway, with the kernel's own token (`kernelfleet.client.FleetClient`):

- ``gpu_settings()``: the bound devices, each with its current and default settings and the
  supported ``ranges`` (``gpu_clock_mhz`` and ``mem_clock_mhz``: sorted lists of supported
  clocks; ``power_limit_w``: ``[min, max]``);
- ``set_gpu_settings(gpu_clock_mhz=..., mem_clock_mhz=..., power_limit_w=..., dry_run=...)``:
  the same values on every bound device (``dry_run``: only the NVML calls it would make);
- ``reset_gpu_settings()``: every device back to its defaults.

The host agent resets the devices itself when the cell's GPUs are released, whatever happens to
the kernel; the backend resets them when a tuning run fails or finds nothing.

The knobs: ``gpu_clock`` and ``mem_clock`` take the values every bound device supports;
``power_limit`` goes down from the maximum in `POWER_STEP_W` steps to the minimum (Zeus's
granularity); ``batch`` is the workload's, offered when the caller gives its values. The
defaults are the devices' defaults, else the maximum of each knob. A setting equal to the
default is put in place by resetting (the default clocks are *unlocked*, which no locked value
equals); any other setting sets every hardware knob of the space.

Each `measure` runs the workload once under an `EnergyMeter` of the bound devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kernelfleet.client import FleetApiError
from kernelfleet.tools.energy.backend import Measurement
from kernelfleet.tools.energy.errors import EnergyError, NoGpuBound, SettingRefused
from kernelfleet.tools.energy.knobs import (
    BATCH,
    GPU_CLOCK,
    MEM_CLOCK,
    POWER_LIMIT,
    Knob,
    SearchSpace,
    Setting,
    select,
)
from kernelfleet.tools.energy.meter import EnergyMeter

POWER_STEP_W = 25.0

API_FIELDS = {GPU_CLOCK: "gpu_clock_mhz", MEM_CLOCK: "mem_clock_mhz", POWER_LIMIT: "power_limit_w"}
"""The gateway's name of each hardware knob."""

Workload = Callable[[float | None], Any]
"""Runs the workload once, at the batch given (None: the space has no batch knob)."""


class FleetBackend:
    """The `EnergyBackend` of this cell's GPUs: `client` is the kernel's `FleetClient` (or
    anything with its ``gpu_settings`` / ``set_gpu_settings`` / ``reset_gpu_settings``),
    `workload` what one evaluation runs, `batches` the batch values to offer (none: no batch
    knob) with `batch_default` (else the largest), `meter` what measures a run (the bound
    devices' `EnergyMeter` by default)."""

    name = "this cell's GPUs"
    deterministic = False

    def __init__(
        self,
        client: Any,
        workload: Workload,
        *,
        batches: Sequence[float] = (),
        batch_default: float | None = None,
        meter: EnergyMeter | None = None,
    ) -> None:
        self.client = client
        self.workload = workload
        self.batches = tuple(sorted(set(batches)))
        self.batch_default = batch_default if batch_default in self.batches else None
        self._meter = meter
        self._settings: dict[str, Any] | None = None
        self._space: SearchSpace | None = None

    # ---- the space -------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The gateway's ``gpu-settings`` of this kernel (asked once). Raises `NoGpuBound`
        when no GPU is bound to the running cell."""
        if self._settings is None:
            self._settings = self._call(self.client.gpu_settings)
            if not self._settings.get("devices"):
                raise NoGpuBound(_NO_GPU)
        return self._settings

    def offered(self) -> list[Knob]:
        devices = self.settings()["devices"]
        knobs = []
        for name in (GPU_CLOCK, MEM_CLOCK):
            field = API_FIELDS[name]
            common = set.intersection(*(set(d["ranges"].get(field) or ()) for d in devices))
            if common:
                values = tuple(sorted(float(v) for v in common))
                knobs.append(Knob(name, values, _default(devices, field, values)))
        limits = [d["ranges"].get(API_FIELDS[POWER_LIMIT]) for d in devices]
        if all(limits):
            low = max(float(pl[0]) for pl in limits)
            high = min(float(pl[1]) for pl in limits)
            if low <= high:
                values = power_steps(low, high)
                knobs.append(
                    Knob(POWER_LIMIT, values, _default(devices, API_FIELDS[POWER_LIMIT], values))
                )
        if self.batches:
            knobs.append(Knob(BATCH, self.batches, self.batch_default or self.batches[-1]))
        return knobs

    def space(self, knobs: Sequence[str] | None = None) -> SearchSpace:
        self._space = select(self.offered(), knobs, self.name)
        return self._space

    # ---- settings and runs -----------------------------------------------------------------

    def measure(self, setting: Setting) -> Measurement:
        self.apply(setting)
        batch = setting.get(BATCH)
        meter = self._meter or EnergyMeter([d["index"] for d in self.settings()["devices"]])
        measurement, _ = meter.measure(lambda: self.workload(batch), items=batch or 1.0)
        return measurement

    def apply(self, setting: Setting) -> None:
        hardware = self._hardware(setting)
        if not hardware:
            return
        if self._space is not None and all(
            hardware[API_FIELDS[k.name]] == k.default
            for k in self._space.knobs
            if k.name in API_FIELDS
        ):
            self.reset()
            return
        self._call(lambda: self.client.set_gpu_settings(**hardware))

    def reset(self) -> None:
        self._call(self.client.reset_gpu_settings)

    def dry_run(self, setting: Setting) -> list[dict[str, Any]]:
        """The NVML calls the host agent says it would make to put `setting` in place, per
        device (``{"uuid", "index", "applied", "calls"}``); nothing changes."""
        hardware = self._hardware(setting)
        answer = self._call(lambda: self.client.set_gpu_settings(**hardware, dry_run=True))
        return list(answer.get("devices", []))

    def _hardware(self, setting: Setting) -> dict[str, Any]:
        return {
            API_FIELDS[name]: (value if name == POWER_LIMIT else int(value))
            for name, value in setting.items()
            if name in API_FIELDS
        }

    def _call(self, call: Callable[[], Any]) -> Any:
        """`call()` with the gateway's refusals as the energy tool's one-line errors."""
        try:
            return call()
        except FleetApiError as e:
            raise _refusal(e) from None


_NO_GPU = (
    "no GPU is bound to this cell, so there is nothing to tune: run it with GPUs "
    "(%%gpus 1 on the cell's first line, or %gpus 1 for every later cell)"
)


def _refusal(error: FleetApiError) -> EnergyError:
    message = getattr(error, "api_message", "") or error.message
    if error.status == 409 and error.reason == "no-gpus-bound":
        return NoGpuBound(_NO_GPU)
    if error.status == 403:
        return SettingRefused(
            f"the host may not change this GPU's settings ({message}): nothing was changed"
        )
    if error.status == 400:
        return SettingRefused(f"the host refused the setting: {message}")
    return EnergyError(f"the gateway refused: {error.message}", reason=error.reason)


def power_steps(low: float, high: float, step: float = POWER_STEP_W) -> tuple[float, ...]:
    """Power limits from `high` down to `low` by `step`, `low` included, ascending."""
    values = []
    value = high
    while value > low:
        values.append(value)
        value -= step
    values.append(low)
    return tuple(sorted(set(values)))


def _default(devices: list[dict[str, Any]], field: str, values: tuple[float, ...]) -> float:
    """The first device's default of `field` when it is one of `values`, else the largest."""
    default = (devices[0].get("default") or {}).get(field)
    if isinstance(default, int | float) and float(default) in values:
        return float(default)
    return values[-1]
