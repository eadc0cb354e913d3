"""`EnergyMeter`: the wall time and the energy per GPU of one run of some code.

Energy comes from NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``:
millijoules since the driver loaded, on Volta and later GPUs), read on each GPU before and
after the run; the difference is what the GPU used meanwhile, whoever used it (other processes
on the same GPU included: kernelfleet binds a cell's GPUs to that cell alone). After the run,
when the code used CUDA through torch, the meter waits for the GPUs to finish
(``torch.cuda.synchronize``) before it stops the clock and reads the counters.

Where energy cannot be measured the meter still times the run, and `EnergyMeter.why` says why
in one line: no GPU bound to the cell, pynvml missing, NVML that does not start (no driver: a
GPU-less machine, virtual GPUs), a device id that is not an NVML index, a GPU without the
counter. Tests pass a fake of the pynvml module as ``nvml``; everything else is this same code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from kernelfleet.protocol import ReplicaEnv
from kernelfleet.tools.energy.backend import GpuEnergy, Measurement


def bound_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The device ids bound to the running cell (``KERNELFLEET_GPUS``), in order."""
    env = os.environ if environ is None else environ
    return [d.strip() for d in env.get(ReplicaEnv.GPUS.value, "").split(",") if d.strip()]


class EnergyMeter:
    """Measures runs on the GPUs `devices` (NVML indices, as ids or ints); `nvml` is the pynvml
    module (imported when None)."""

    def __init__(self, devices: Sequence[str | int], nvml: ModuleType | Any = None) -> None:
        self.devices = [str(d) for d in devices]
        self._nvml = nvml
        self.why: str | None = None
        """Why energy is not measured (None: it is); set by `measure` on its first call."""

    @classmethod
    def for_cell(cls, environ: Mapping[str, str] | None = None, nvml: Any = None) -> EnergyMeter:
        """The meter of the GPUs bound to the running cell."""
        return cls(bound_gpus(environ), nvml)

    def measure(self, run: Callable[[], Any], items: float = 1.0) -> tuple[Measurement, Any]:
        """Run `run()` once; returns its `Measurement` (energy None when it cannot be
        measured: see `why`) and what `run` returned. An exception from `run` propagates."""
        handles = self._handles()
        try:
            before = self._counters(handles)
            started = time.perf_counter()
            value = run()
            _wait_for_cuda()
            latency = time.perf_counter() - started
            after = self._counters(handles)
        finally:
            self._shutdown(handles)
        if before is None or after is None:
            return Measurement(latency, None, items), value
        per_gpu = tuple(
            GpuEnergy(index, (after[index] - before[index]) / 1000.0) for index in before
        )
        return Measurement(latency, sum(g.energy_j for g in per_gpu), items, per_gpu), value

    # ---- NVML ------------------------------------------------------------------------------

    def _handles(self) -> dict[int, Any] | None:
        """index -> NVML handle for every device, or None (and `why`) when energy cannot be
        read. NVML is left initialised only when handles are returned."""
        self.why = None
        if not self.devices:
            self.why = "no GPU is bound to this cell (give it one: %%gpus 1 on its first line)"
            return None
        if not all(d.isdigit() for d in self.devices):
            self.why = f"the bound devices {', '.join(self.devices)} are not NVML indices"
            return None
        nvml = self._module()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception as e:
            self.why = f"NVML did not start ({_nvml_error(e)}): no NVIDIA driver on this host"
            return None
        handles: dict[int, Any] = {}
        try:
            for device in self.devices:
                handle = nvml.nvmlDeviceGetHandleByIndex(int(device))
                nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # supported?
                handles[int(device)] = handle
        except Exception as e:
            self.why = f"GPU {device} has no total-energy counter ({_nvml_error(e)})"
            self._shutdown({0: None})
            return None
        return handles

    def _counters(self, handles: dict[int, Any] | None) -> dict[int, float] | None:
        if handles is None:
            return None
        nvml = self._module()
        assert nvml is not None
        return {
            index: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            for index, handle in handles.items()
        }

    def _shutdown(self, handles: dict[int, Any] | None) -> None:
        if handles is None or self._nvml is None:
            return
        with contextlib.suppress(Exception):  # NVML refuses only when it was not initialised
            self._nvml.nvmlShutdown()

    def _module(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                self.why = "pynvml is not installed (pip install nvidia-ml-py)"
                return None
            self._nvml = pynvml
        return self._nvml


def _wait_for_cuda() -> None:
    """Wait for every GPU torch used in this process, when it used CUDA at all."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    for device in range(torch.cuda.device_count()):
        torch.cuda.synchronize(device)


def _nvml_error(error: Exception) -> str:
    return str(error) or type(error).__name__
