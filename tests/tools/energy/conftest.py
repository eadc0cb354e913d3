"""Fixtures of the energy tool's tests: where Zeus's power tables are, and fakes of the two
boundaries the tool talks through — the pynvml module and the gateway's gpu-settings API (the
`FleetClient` methods) — that simulate a GPU whose power and speed follow its settings."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.client import FleetApiError
from kernelfleet.tools.energy.replay import TRACE_VARIABLE

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def zeus_trace() -> Path:
    """The folder of ``summary_power_<gpu>.csv``: ``$KERNELFLEET_ZEUS_TRACE``, else
    ``../shared/data/zeus/trace`` next to the repository; the test is skipped without it."""
    folder = Path(os.environ.get(TRACE_VARIABLE) or REPO_ROOT / ".." / "shared/data/zeus/trace")
    if not any(folder.glob("summary_power_*.csv")):
        pytest.skip(f"Zeus's power tables are not in {folder} (set {TRACE_VARIABLE})")
    return folder


class NVMLError(Exception):
    """pynvml's error class, as the fake raises it."""


class SimulatedGpu:
    """A GPU whose power follows its settings as dynamic power does (about the cube of the
    clock): busy, it draws ``idle_w + (max_power - idle_w) * (clock / max_clock) ** 3``, where
    the clock is the locked `gpu_clock` lowered further as far as the power limit needs; work
    takes ``max_clock / clock`` times longer. Its energy counter (mJ) integrates the draw."""

    def __init__(self, index: int, max_clock: float = 1980.0, max_power: float = 700.0) -> None:
        self.index = index
        self.max_clock = max_clock
        self.max_power = max_power
        self.gpu_clock = max_clock
        self.power_limit = max_power
        self.busy = False
        self.idle_w = 60.0
        self.energy_mj = 1_000_000.0
        self._since = time.perf_counter()

    def clock(self) -> float:
        """The clock it runs at: the locked clock, or lower when the power limit says so."""
        room = (self.power_limit - self.idle_w) / (self.max_power - self.idle_w)
        return min(self.gpu_clock, self.max_clock * max(room, 1e-3) ** (1 / 3))

    def draw_w(self) -> float:
        if not self.busy:
            return self.idle_w
        return self.idle_w + (self.max_power - self.idle_w) * (self.clock() / self.max_clock) ** 3

    def advance(self) -> None:
        now = time.perf_counter()
        self.energy_mj += self.draw_w() * (now - self._since) * 1000
        self._since = now

    def run(self, work_s: float) -> None:
        """Busy for `work_s` at full clock, longer at a lower clock."""
        self.advance()
        self.busy = True
        time.sleep(work_s * self.max_clock / self.clock())
        self.advance()
        self.busy = False


class FakeNvml:
    """The part of pynvml `EnergyMeter` calls, over `SimulatedGpu`s."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[SimulatedGpu], *, driver: bool = True, counter: bool = True):
        self.gpus = {gpu.index: gpu for gpu in gpus}
        self.driver = driver
        self.counter = counter
        self.initialised = 0

    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError("Driver Not Loaded")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise NVMLError("Uninitialized")
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedGpu:
        if index not in self.gpus:
            raise NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimulatedGpu) -> int:
        if not self.counter:
            raise NVMLError("Not Supported")
        handle.advance()
        return int(handle.energy_mj)


class FakeGateway:
    """`FleetClient`'s gpu-settings methods as the gateway answers them (contract of issue 14),
    over `SimulatedGpu`s; `refuse` makes every change answer that (status, reason)."""

    CLOCKS = [510.0, 750.0, 990.0, 1230.0, 1470.0, 1710.0, 1980.0]

    def __init__(self, gpus: list[SimulatedGpu], refuse: tuple[int, str] | None = None) -> None:
        self.gpus = gpus
        self.refuse = refuse
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def gpu_settings(self) -> dict[str, Any]:
        self.calls.append(("get", {}))
        if not self.gpus:
            raise FleetApiError(409, "no-gpus-bound", "no running cell of kernel k holds GPUs")
        return {
            "kernel_id": "k",
            "host_id": "host-1",
            "cell_id": "c",
            "devices": [
                {
                    "uuid": f"GPU-{gpu.index}",
                    "index": gpu.index,
                    "current": {"gpu_clock_mhz": gpu.gpu_clock, "power_limit_w": gpu.power_limit},
                    "default": {"gpu_clock_mhz": gpu.max_clock, "power_limit_w": gpu.max_power},
                    "ranges": {
                        "gpu_clock_mhz": self.CLOCKS,
                        "mem_clock_mhz": [2619.0],
                        "power_limit_w": [200.0, gpu.max_power],
                    },
                }
                for gpu in self.gpus
            ],
        }

    def set_gpu_settings(self, *, gpu_clock_mhz=None, mem_clock_mhz=None, power_limit_w=None,
                         dry_run=False) -> dict[str, Any]:  # fmt: skip
        asked = {"gpu_clock_mhz": gpu_clock_mhz, "mem_clock_mhz": mem_clock_mhz,
                 "power_limit_w": power_limit_w}  # fmt: skip
        asked = {k: v for k, v in asked.items() if v is not None}
        self.calls.append(("set", asked | {"dry_run": dry_run}))
        if self.refuse is not None:
            status, reason = self.refuse
            raise FleetApiError(status, reason, "NVML: Insufficient Permissions")
        devices = []
        for gpu in self.gpus:
            calls = []
            if "gpu_clock_mhz" in asked:
                clock = int(asked["gpu_clock_mhz"])
                calls.append(f"nvmlDeviceSetGpuLockedClocks({gpu.index}, {clock}, {clock})")
            if "power_limit_w" in asked:
                milliwatts = int(asked["power_limit_w"] * 1000)
                calls.append(f"nvmlDeviceSetPowerManagementLimit({gpu.index}, {milliwatts})")
            if not dry_run:
                gpu.advance()
                gpu.gpu_clock = asked.get("gpu_clock_mhz", gpu.gpu_clock)
                gpu.power_limit = asked.get("power_limit_w", gpu.power_limit)
            devices.append({"uuid": f"GPU-{gpu.index}", "index": gpu.index, "applied": asked,
                            "calls": calls})  # fmt: skip
        return {"kernel_id": "k", "host_id": "host-1", "cell_id": "c", "dry_run": dry_run,
                "devices": devices}  # fmt: skip

    def reset_gpu_settings(self) -> None:
        self.calls.append(("reset", {}))
        for gpu in self.gpus:
            gpu.advance()
            gpu.gpu_clock, gpu.power_limit = gpu.max_clock, gpu.max_power

    def changes(self) -> list[tuple[str, dict[str, Any]]]:
        """The calls that changed something (sets that were not dry runs, and resets)."""
        return [c for c in self.calls if c[0] == "reset" or (c[0] == "set" and not c[1]["dry_run"])]


@pytest.fixture
def gpus() -> list[SimulatedGpu]:
    return [SimulatedGpu(0), SimulatedGpu(1)]
