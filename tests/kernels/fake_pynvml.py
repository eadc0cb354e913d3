"""A fake of NVML's Python API (``pynvml``, from nvidia-ml-py), for tests on machines without
GPUs: the functions `NvmlGpuControl` calls, with the real module's names, argument lists,
units (mW, MHz), constants and error class (``pynvml.NVMLError`` and its subclasses), over
devices kept in memory.

``FakeNvml.refuse(name, code)`` makes every later call of function `name` fail with NVML error
`code` (NO_PERMISSION by default), as a driver refuses a process that is not root.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import pynvml as real

COPIED = (
    "NVMLError",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_CLOCK_GRAPHICS",
    "NVML_CLOCK_MEM",
)


@dataclass
class FakeGpu:
    """One device: an A100-like by default. Power values in mW, as NVML has them."""

    uuid: str
    graphics_clocks: tuple[int, ...] = tuple(range(210, 1411, 15))
    mem_clocks: tuple[int, ...] = (1215,)
    power_min_mw: int = 100_000
    power_max_mw: int = 400_000
    power_default_mw: int = 400_000
    mem_locks_supported: bool = True
    power_limit_mw: int = 400_000
    gpu_locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    applications: tuple[int, int] | None = None
    """(mem, graphics) application clocks, when set."""


class FakeNvml(types.ModuleType):
    """The fake module; `gpus` by UUID, `calls` every device call in order as
    ``name(uuid, *args)``."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__("pynvml")
        for name in COPIED:
            setattr(self, name, getattr(real, name))
        self.gpus = {gpu.uuid: gpu for gpu in gpus}
        self.calls: list[str] = []
        self.initialised = 0
        self._refused: dict[str, int] = {}

    def refuse(self, name: str, code: int = real.NVML_ERROR_NO_PERMISSION) -> None:
        self._refused[name] = code

    def _enter(self, name: str, gpu: FakeGpu, *args: object) -> None:
        if self.initialised <= 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        self.calls.append(f"{name}({', '.join(map(str, (gpu.uuid, *args)))})")
        if name in self._refused:
            raise real.NVMLError(self._refused[name])

    # ---- library --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> FakeGpu:
        if not isinstance(uuid, bytes):  # the real one passes it to ctypes' c_char_p
            raise TypeError("bytes or integer address expected instead of str instance")
        try:
            return self.gpus[uuid.decode()]
        except KeyError:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND) from None

    # ---- queries --------------------------------------------------------------------------

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: FakeGpu) -> list[int]:
        return sorted(handle.mem_clocks, reverse=True)  # NVML lists them highest first

    def nvmlDeviceGetSupportedGraphicsClocks(
        self, handle: FakeGpu, memoryClockMHz: int
    ) -> list[int]:
        if memoryClockMHz not in handle.mem_clocks:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return sorted(handle.graphics_clocks, reverse=True)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu) -> list[int]:
        return [handle.power_min_mw, handle.power_max_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeGpu) -> int:
        return handle.power_default_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeGpu) -> int:
        return handle.power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, type: int) -> int:
        if type == real.NVML_CLOCK_GRAPHICS:
            if handle.gpu_locked:
                return handle.gpu_locked[1]
            return handle.applications[1] if handle.applications else max(handle.graphics_clocks)
        if handle.mem_locked:
            return handle.mem_locked[1]
        return handle.applications[0] if handle.applications else max(handle.mem_clocks)

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, type: int) -> int:
        clocks = handle.graphics_clocks if type == real.NVML_CLOCK_GRAPHICS else handle.mem_clocks
        return max(clocks)

    # ---- changes --------------------------------------------------------------------------

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: FakeGpu, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        self._enter("nvmlDeviceSetGpuLockedClocks", handle, minGpuClockMHz, maxGpuClockMHz)
        handle.gpu_locked = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeGpu) -> None:
        self._enter("nvmlDeviceResetGpuLockedClocks", handle)
        handle.gpu_locked = None

    def nvmlDeviceSetMemoryLockedClocks(
        self, handle: FakeGpu, minMemClockMHz: int, maxMemClockMHz: int
    ) -> None:
        self._enter("nvmlDeviceSetMemoryLockedClocks", handle, minMemClockMHz, maxMemClockMHz)
        if not handle.mem_locks_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        handle.mem_locked = (minMemClockMHz, maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: FakeGpu) -> None:
        self._enter("nvmlDeviceResetMemoryLockedClocks", handle)
        if not handle.mem_locks_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        handle.mem_locked = None

    def nvmlDeviceSetApplicationsClocks(
        self, handle: FakeGpu, maxMemClockMHz: int, maxGraphicsClockMHz: int
    ) -> None:
        self._enter("nvmlDeviceSetApplicationsClocks", handle, maxMemClockMHz, maxGraphicsClockMHz)
        handle.applications = (maxMemClockMHz, maxGraphicsClockMHz)

    def nvmlDeviceResetApplicationsClocks(self, handle: FakeGpu) -> None:
        self._enter("nvmlDeviceResetApplicationsClocks", handle)
        handle.applications = None

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu, limit: int) -> None:
        self._enter("nvmlDeviceSetPowerManagementLimit", handle, limit)
        if not handle.power_min_mw <= limit <= handle.power_max_mw:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        handle.power_limit_mw = limit
