"""Clocks and power limits of a host's GPUs: real ones through NVML, virtual ones in memory.

Three knobs (`KNOBS`): ``gpu_clock_mhz`` (the graphics clock, locked to one value),
``mem_clock_mhz`` (the memory clock, locked) and ``power_limit_w`` (the power management
limit). Each change is a list of NVML calls (`NvmlCall`), planned the same way for every GPU:

- ``gpu_clock_mhz=f``: ``nvmlDeviceSetGpuLockedClocks(i, f, f)``; reset:
  ``nvmlDeviceResetGpuLockedClocks(i)``;
- ``mem_clock_mhz=f``: ``nvmlDeviceSetMemoryLockedClocks(i, f, f)``; a GPU older than Ampere
  answers NOT_SUPPORTED, and then the application clocks are set instead,
  ``nvmlDeviceSetApplicationsClocks(i, f, g)`` with ``g`` the highest graphics clock supported at
  ``f``; reset: ``nvmlDeviceResetMemoryLockedClocks(i)`` (or ``nvmlDeviceResetApplicationsClocks``);
- ``power_limit_w=w``: ``nvmlDeviceSetPowerManagementLimit(i, w * 1000)`` (NVML takes mW);
  reset: the same call with the device's default limit.

`GpuControl` validates a request against each device's ranges, applies it knob by knob and, if
any call fails, undoes what this request changed before raising: a request is applied whole or
not at all. NVML's NO_PERMISSION (the agent is not root, or the driver forbids it) becomes
`PermissionDenied`. A dry run returns the calls as text and changes nothing.

`NvmlGpuControl` calls the real ``pynvml`` module (``nvidia-ml-py``); `VirtualGpuControl` runs
the very same plans against virtual devices whose ranges are configured, and records every call,
so that the whole path (agent, gateway, notebook) runs on machines without GPUs.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import FleetError, InvalidRequest, PermissionDenied
from kernelfleet.kernels.agent.gpus import GpuDevice

log = logging.getLogger("kernelfleet.host.gpu_control")

KNOBS: tuple[str, ...] = ("gpu_clock_mhz", "mem_clock_mhz", "power_limit_w")
"""What a request may set, in the order it is applied (and undone in reverse)."""

Settings = dict[str, float]
"""Knob -> value (clocks in MHz, power in W)."""


class GpuControlFailed(FleetError):
    """NVML failed for another reason than a refusal (the GPU is lost, say)."""

    reason = "gpu-control-failed"


@dataclass(frozen=True)
class NvmlCall:
    """One NVML call on a device: ``function(handle, *args)``; `text` shows the device index
    where the handle goes."""

    function: str
    args: tuple[int, ...] = ()

    def text(self, index: int) -> str:
        return f"{self.function}({', '.join(str(a) for a in (index, *self.args))})"


@dataclass(frozen=True)
class GpuRanges:
    """What a device accepts: supported clocks (sorted) and the power limit's [min, max]."""

    gpu_clock_mhz: tuple[int, ...]
    mem_clock_mhz: tuple[int, ...]
    power_limit_w: tuple[float, float]

    def check(self, knob: str, value: float, device: str) -> None:
        """`InvalidRequest`, listing what is supported, if `value` is outside the range."""
        if knob == "power_limit_w":
            low, high = self.power_limit_w
            if not low <= value <= high:
                raise InvalidRequest(
                    f"power_limit_w={value:g} is outside {device}'s range: {low:g} to {high:g} W"
                )
            return
        supported: tuple[int, ...] = getattr(self, knob)
        if value not in supported:
            raise InvalidRequest(
                f"{knob}={value:g} is not supported by {device}; supported: {_listing(supported)}"
            )

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "gpu_clock_mhz": list(self.gpu_clock_mhz),
            "mem_clock_mhz": list(self.mem_clock_mhz),
            "power_limit_w": list(self.power_limit_w),
        }


def _listing(values: Sequence[int]) -> str:
    if len(values) <= 12:
        return ", ".join(str(v) for v in values) + " MHz"
    return (
        f"{len(values)} values from {values[0]} to {values[-1]} MHz ({values[0]}, {values[1]}, ...)"
    )


def parse_settings(body: Mapping[str, Any]) -> Settings:
    """The knobs `body` sets, validated as numbers: clocks positive integers, the power limit
    a positive finite number; null leaves a knob alone. At least one knob is required, and
    nothing else; `InvalidRequest` names what is wrong and lists the knobs."""
    unknown = sorted(set(body) - set(KNOBS))
    if unknown:
        raise InvalidRequest(f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    settings: Settings = {}
    for knob in KNOBS:
        value = body.get(knob)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(f"{knob!r} must be a number, not {value!r}")
        if knob != "power_limit_w" and value != int(value):
            raise InvalidRequest(f"{knob!r} must be a whole number of MHz, not {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise InvalidRequest(f"{knob!r} must be a positive number, not {value!r}")
        settings[knob] = int(value) if knob != "power_limit_w" else float(value)
    if not settings:
        raise InvalidRequest(f"nothing to set: give one or more of {', '.join(KNOBS)}")
    return settings


@dataclass
class _Device:
    """One device as the control keeps it: what it set (knob -> value) and how."""

    info: GpuDevice
    changed: Settings = field(default_factory=dict)
    mem_via_applications: bool = False
    """Its memory clock could not be locked (pre-Ampere): application clocks are used."""


class GpuControl(ABC):
    """Reads and changes the clocks and power limits of `devices`; see the module docstring.

    Thread-safe: one request at a time. ``changed(uuid)`` is what this control set on a device
    and has not reset; a restarted agent learns it again from its state file
    (`kernelfleet.kernels.agent.gpu_settings`) and hands it to `adopt`.
    """

    kind = "abstract"

    def __init__(self, devices: Iterable[GpuDevice]) -> None:
        self._devices = {device.uuid: _Device(device) for device in devices}
        self._lock = threading.Lock()

    # ---- reading ---------------------------------------------------------------------------

    def uuids(self) -> list[str]:
        return list(self._devices)

    def device(self, uuid: str) -> GpuDevice:
        try:
            return self._devices[uuid].info
        except KeyError:
            raise InvalidRequest(f"this host has no GPU {uuid!r}") from None

    def changed(self, uuid: str) -> Settings:
        self.device(uuid)
        return dict(self._devices[uuid].changed)

    def describe(self, uuid: str) -> dict[str, Any]:
        """``{"uuid", "index", "current", "default", "ranges", "changed"}``: the values now,
        with nothing locked (the maximum clocks, the default power limit), the ranges, and
        what this control set."""
        info = self.device(uuid)
        with self._lock:
            return {
                "uuid": uuid,
                "index": info.index,
                "current": self._current(uuid),
                "default": self._default(uuid),
                "ranges": self._ranges(uuid).to_dict(),
                "changed": dict(self._devices[uuid].changed),
            }

    # ---- changing --------------------------------------------------------------------------

    def apply(
        self, uuids: Sequence[str], settings: Settings, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        """Set `settings` on every device of `uuids`; returns per device ``{"uuid", "index",
        "applied", "calls"}`` (the NVML calls as text, made or, with `dry_run`, planned).

        Validates everything first (`InvalidRequest`: an unknown device or knob, a value out of
        range). If a call fails, every change this request made is undone, then
        `PermissionDenied` (NVML's NO_PERMISSION), `InvalidRequest` (NOT_SUPPORTED) or
        `GpuControlFailed` is raised; a failure of the undoing itself is logged and named in
        the message."""
        unknown = sorted(set(settings) - set(KNOBS))
        if unknown:
            raise InvalidRequest(f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
        with self._lock:
            for uuid in uuids:
                ranges = self._ranges_of(uuid)
                for knob, value in settings.items():
                    ranges.check(knob, value, f"GPU {self.device(uuid).index} ({uuid})")
            if dry_run:
                return [self._planned(uuid, settings) for uuid in uuids]
            done: list[tuple[str, str, float | None]] = []
            results = []
            try:
                for uuid in uuids:
                    calls: list[str] = []
                    for knob in (k for k in KNOBS if k in settings):
                        before = self._devices[uuid].changed.get(knob)
                        calls += self._set(uuid, knob, settings[knob])
                        done.append((uuid, knob, before))
                    results.append(self._result(uuid, settings, calls))
            except FleetError as e:
                problems = self._undo(done)
                if problems:
                    stuck = f"; undoing failed too, so these stay changed: {problems}"
                    raise type(e)(e.message + stuck) from e
                raise
            return results

    def reset(
        self, uuids: Sequence[str], knobs: Iterable[str] | None = None, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        """Back to the defaults: every knob this control changed on `uuids` (`knobs`: only
        those; all three, changed or not, with ``knobs=KNOBS``). Returns per device
        ``{"uuid", "index", "calls"}``. Every device is tried; the first failure is raised
        after the others were reset."""
        first: FleetError | None = None
        results = []
        with self._lock:
            for uuid in uuids:
                device = self._devices.get(uuid)
                if device is None:
                    raise InvalidRequest(f"this host has no GPU {uuid!r}")
                wanted = list(device.changed) if knobs is None else list(knobs)
                ordered = [k for k in reversed(KNOBS) if k in wanted]
                calls: list[str] = []
                for knob in ordered:
                    if dry_run:
                        calls += [c.text(device.info.index) for c in self._plan_reset(uuid, knob)]
                        continue
                    try:
                        calls += self._reset(uuid, knob)
                    except FleetError as e:
                        log.error("GPU %s: could not reset %s: %s", uuid, knob, e)
                        first = first or e
                results.append({"uuid": uuid, "index": device.info.index, "calls": calls})
        if first is not None:
            raise first
        return results

    def adopt(self, uuid: str, changed: Mapping[str, float]) -> None:
        """Take `changed` as set on `uuid` (by a previous run of the agent), so that `reset`
        undoes it; unknown devices and knobs are ignored."""
        device = self._devices.get(uuid)
        if device is not None:
            device.changed.update({k: v for k, v in changed.items() if k in KNOBS})

    # ---- planning (the same for every kind of GPU) -----------------------------------------

    def _plan_set(self, uuid: str, knob: str, value: float) -> list[NvmlCall]:
        if knob == "gpu_clock_mhz":
            return [NvmlCall("nvmlDeviceSetGpuLockedClocks", (int(value), int(value)))]
        if knob == "mem_clock_mhz":
            if self._devices[uuid].mem_via_applications:
                graphics = self._highest_graphics_clock(uuid, int(value))
                return [NvmlCall("nvmlDeviceSetApplicationsClocks", (int(value), graphics))]
            return [NvmlCall("nvmlDeviceSetMemoryLockedClocks", (int(value), int(value)))]
        return [NvmlCall("nvmlDeviceSetPowerManagementLimit", (round(value * 1000),))]

    def _plan_reset(self, uuid: str, knob: str) -> list[NvmlCall]:
        if knob == "gpu_clock_mhz":
            return [NvmlCall("nvmlDeviceResetGpuLockedClocks")]
        if knob == "mem_clock_mhz":
            if self._devices[uuid].mem_via_applications:
                return [NvmlCall("nvmlDeviceResetApplicationsClocks")]
            return [NvmlCall("nvmlDeviceResetMemoryLockedClocks")]
        default = self._default(uuid)["power_limit_w"]
        return [NvmlCall("nvmlDeviceSetPowerManagementLimit", (round(default * 1000),))]

    def _set(self, uuid: str, knob: str, value: float) -> list[str]:
        calls = self._run(uuid, self._plan_set(uuid, knob, value))
        self._devices[uuid].changed[knob] = value
        return calls

    def _reset(self, uuid: str, knob: str) -> list[str]:
        calls = self._run(uuid, self._plan_reset(uuid, knob))
        self._devices[uuid].changed.pop(knob, None)
        return calls

    def _run(self, uuid: str, plan: list[NvmlCall]) -> list[str]:
        index = self._devices[uuid].info.index
        made = []
        for call in plan:
            made += [c.text(index) for c in self._call(uuid, call)]
        return made

    def _undo(self, done: list[tuple[str, str, float | None]]) -> str:
        """Put back what a failed request changed, last first; returns what could not be."""
        problems = []
        for uuid, knob, before in reversed(done):
            try:
                if before is None:
                    self._reset(uuid, knob)
                else:
                    self._set(uuid, knob, before)
            except FleetError as e:
                log.error("GPU %s: could not undo %s: %s", uuid, knob, e)
                problems.append(f"{knob} of GPU {self._devices[uuid].info.index} ({e})")
        return ", ".join(problems)

    def _planned(self, uuid: str, settings: Settings) -> dict[str, Any]:
        index = self._devices[uuid].info.index
        plan = [
            c
            for knob in KNOBS
            if knob in settings
            for c in self._plan_set(uuid, knob, settings[knob])
        ]
        return self._result(uuid, settings, [c.text(index) for c in plan])

    def _result(self, uuid: str, settings: Settings, calls: list[str]) -> dict[str, Any]:
        index = self._devices[uuid].info.index
        return {"uuid": uuid, "index": index, "applied": dict(settings), "calls": calls}

    def _ranges_of(self, uuid: str) -> GpuRanges:
        self.device(uuid)
        return self._ranges(uuid)

    # ---- what each kind of GPU does --------------------------------------------------------

    @abstractmethod
    def _call(self, uuid: str, call: NvmlCall) -> list[NvmlCall]:
        """Make `call` on the device; return the calls made (a fallback may replace it).
        Raises `PermissionDenied`, `InvalidRequest` or `GpuControlFailed`."""

    @abstractmethod
    def _ranges(self, uuid: str) -> GpuRanges: ...

    @abstractmethod
    def _current(self, uuid: str) -> Settings: ...

    @abstractmethod
    def _default(self, uuid: str) -> Settings: ...

    @abstractmethod
    def _highest_graphics_clock(self, uuid: str, mem_clock: int) -> int: ...


# ---- real GPUs ----------------------------------------------------------------------------


class NvmlGpuControl(GpuControl):
    """The host's real GPUs through ``pynvml`` (`nvml`: the module, so tests can give a fake of
    NVML's API; the real one by default). Initialises NVML once, at construction."""

    kind = "nvml"

    def __init__(self, devices: Iterable[GpuDevice], nvml: Any = None) -> None:
        super().__init__(devices)
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise GpuControlFailed(f"NVML could not be initialised: {e}") from e
        try:  # NVML takes the UUID as bytes (a C string)
            self._handles = {
                uuid: nvml.nvmlDeviceGetHandleByUUID(uuid.encode()) for uuid in self._devices
            }
        except nvml.NVMLError as e:
            raise GpuControlFailed(f"NVML could not find the host's GPUs by UUID: {e}") from e
        self._cached_ranges: dict[str, GpuRanges] = {}

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def _call(self, uuid: str, call: NvmlCall) -> list[NvmlCall]:
        nvml, device = self._nvml, self._devices[uuid]
        try:
            getattr(nvml, call.function)(self._handles[uuid], *call.args)
            return [call]
        except nvml.NVMLError as e:
            unsupported = e.value == nvml.NVML_ERROR_NOT_SUPPORTED
            fallback = self._fallback(uuid, call) if unsupported else None
            if fallback is None:
                raise self._error(call, device.info.index, e) from e
        log.info("GPU %s: %s is not supported; using application clocks", uuid, call.function)
        device.mem_via_applications = True
        return self._call(uuid, fallback)

    def _fallback(self, uuid: str, call: NvmlCall) -> NvmlCall | None:
        """What replaces a memory-clock lock a GPU does not support: its application clocks."""
        if call.function == "nvmlDeviceSetMemoryLockedClocks":
            mem = call.args[0]
            graphics = self._highest_graphics_clock(uuid, mem)
            return NvmlCall("nvmlDeviceSetApplicationsClocks", (mem, graphics))
        if call.function == "nvmlDeviceResetMemoryLockedClocks":
            return NvmlCall("nvmlDeviceResetApplicationsClocks")
        return None

    def _error(self, call: NvmlCall, index: int, error: Any) -> FleetError:
        what = f"{call.text(index)}: {error}"
        if error.value == self._nvml.NVML_ERROR_NO_PERMISSION:
            return PermissionDenied(
                f"NVML refused {what}; setting GPU clocks and power limits needs root on the "
                "host (run the host agent as root) and a driver that allows it"
            )
        if error.value == self._nvml.NVML_ERROR_NOT_SUPPORTED:
            return InvalidRequest(f"GPU {index} does not support {what}")
        return GpuControlFailed(f"NVML failed: {what}")

    def _query(self, uuid: str, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(self._handles[uuid], *args)
        except self._nvml.NVMLError as e:
            raise GpuControlFailed(f"NVML failed: {function} on GPU {uuid}: {e}") from e

    def _ranges(self, uuid: str) -> GpuRanges:
        cached = self._cached_ranges.get(uuid)
        if cached is None:
            mem = sorted(int(f) for f in self._query(uuid, "nvmlDeviceGetSupportedMemoryClocks"))
            graphics = sorted(
                {
                    int(f)
                    for m in mem
                    for f in self._query(uuid, "nvmlDeviceGetSupportedGraphicsClocks", m)
                }
            )
            low, high = self._query(uuid, "nvmlDeviceGetPowerManagementLimitConstraints")
            cached = GpuRanges(tuple(graphics), tuple(mem), (low / 1000, high / 1000))
            self._cached_ranges[uuid] = cached
        return cached

    def _current(self, uuid: str) -> Settings:
        nvml = self._nvml
        return {
            "gpu_clock_mhz": self._query(uuid, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_GRAPHICS),
            "mem_clock_mhz": self._query(uuid, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM),
            "power_limit_w": self._query(uuid, "nvmlDeviceGetPowerManagementLimit") / 1000,
        }

    def _default(self, uuid: str) -> Settings:
        nvml = self._nvml
        return {
            "gpu_clock_mhz": self._query(
                uuid, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_GRAPHICS
            ),
            "mem_clock_mhz": self._query(uuid, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM),
            "power_limit_w": self._query(uuid, "nvmlDeviceGetPowerManagementDefaultLimit") / 1000,
        }

    def _highest_graphics_clock(self, uuid: str, mem_clock: int) -> int:
        return max(
            int(f) for f in self._query(uuid, "nvmlDeviceGetSupportedGraphicsClocks", mem_clock)
        )


# ---- virtual GPUs -------------------------------------------------------------------------

VIRTUAL_RANGES = GpuRanges(
    gpu_clock_mhz=tuple(range(210, 1411, 15)),
    mem_clock_mhz=(1215,),
    power_limit_w=(100.0, 400.0),
)
"""Virtual GPUs' ranges unless configured: those of an A100-SXM4 (graphics clocks 210-1410 MHz
in 15 MHz steps, one memory clock, power limit 100-400 W); the maximum is the default."""


def parse_virtual_ranges(text: str) -> GpuRanges:
    """Ranges from JSON ``{"gpu_clock_mhz": [...], "mem_clock_mhz": [...], "power_limit_w":
    [min, max]}`` (a key left out keeps `VIRTUAL_RANGES`'); `ValueError` saying what is wrong."""
    try:
        given = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise ValueError(f"virtual GPU ranges are not JSON: {e}") from None
    if not isinstance(given, dict) or set(given) - set(KNOBS):
        raise ValueError(f"virtual GPU ranges must be an object with keys among {', '.join(KNOBS)}")
    clocks = {}
    for knob in ("gpu_clock_mhz", "mem_clock_mhz"):
        values = given.get(knob, getattr(VIRTUAL_RANGES, knob))
        if not values or not all(isinstance(v, int) and v > 0 for v in values):
            raise ValueError(f"{knob} must be a non-empty list of positive integers (MHz)")
        clocks[knob] = tuple(sorted(set(values)))
    power = given.get("power_limit_w", VIRTUAL_RANGES.power_limit_w)
    if (
        len(power) != 2
        or not all(isinstance(v, int | float) and v > 0 for v in power)
        or power[0] > power[1]
    ):
        raise ValueError("power_limit_w must be [min, max] in W, 0 < min <= max")
    return GpuRanges(
        clocks["gpu_clock_mhz"], clocks["mem_clock_mhz"], (float(power[0]), float(power[1]))
    )


class VirtualGpuControl(GpuControl):
    """Virtual GPUs' clocks and power limits, kept in memory: every NVML call of a plan is
    carried out on them and recorded in `calls`. The default is the top of each range.
    ``permitted=False`` refuses every change as NVML refuses an agent that is not root."""

    kind = "virtual"

    def __init__(
        self,
        devices: Iterable[GpuDevice],
        ranges: GpuRanges = VIRTUAL_RANGES,
        *,
        permitted: bool = True,
    ) -> None:
        super().__init__(devices)
        self.ranges = ranges
        self.permitted = permitted
        self._values: dict[str, Settings] = {uuid: {} for uuid in self._devices}
        self.calls: list[str] = []
        """Every call made, as text, in order."""

    def _call(self, uuid: str, call: NvmlCall) -> list[NvmlCall]:
        index = self._devices[uuid].info.index
        if not self.permitted:
            raise PermissionDenied(
                f"NVML refused {call.text(index)}: Insufficient Permissions (a virtual GPU "
                "configured to refuse, as for a host agent that is not root)"
            )
        values = self._values[uuid]
        name, args = call.function, call.args
        if name == "nvmlDeviceSetGpuLockedClocks":
            values["gpu_clock_mhz"] = args[0]
        elif name == "nvmlDeviceSetMemoryLockedClocks":
            values["mem_clock_mhz"] = args[0]
        elif name == "nvmlDeviceSetPowerManagementLimit":
            values["power_limit_w"] = args[0] / 1000
        elif name == "nvmlDeviceResetGpuLockedClocks":
            values.pop("gpu_clock_mhz", None)
        elif name == "nvmlDeviceResetMemoryLockedClocks":
            values.pop("mem_clock_mhz", None)
        else:
            raise InvalidRequest(f"a virtual GPU does not support {call.text(index)}")
        self.calls.append(call.text(index))
        return [call]

    def _ranges(self, uuid: str) -> GpuRanges:
        return self.ranges

    def _current(self, uuid: str) -> Settings:
        return {**self._default(uuid), **self._values[uuid]}

    def _default(self, uuid: str) -> Settings:
        return {
            "gpu_clock_mhz": self.ranges.gpu_clock_mhz[-1],
            "mem_clock_mhz": self.ranges.mem_clock_mhz[-1],
            "power_limit_w": self.ranges.power_limit_w[1],
        }

    def _highest_graphics_clock(self, uuid: str, mem_clock: int) -> int:
        return self.ranges.gpu_clock_mhz[-1]
