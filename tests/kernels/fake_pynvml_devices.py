"""A fake of NVML's Python API (``pynvml``), for tests only: the calls the agent's inventory and
fingerprint make, over a list of described devices. Install it with `install`, which puts it in
``sys.modules`` for the test's duration, so the inventory's ``import pynvml`` finds it."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    """pynvml's error type (the fake keeps only its message)."""


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * 1024**3
    clocks: dict[int, int] = field(
        default_factory=lambda: {NVML_CLOCK_SM: 345, NVML_CLOCK_MEM: 2619}
    )
    max_clocks: dict[int, int] = field(
        default_factory=lambda: {NVML_CLOCK_SM: 1980, NVML_CLOCK_MEM: 2619}
    )
    power_limit_mw: int | None = 700_000
    power_default_mw: int = 700_000


@dataclass
class _Memory:
    total: int


def install(monkeypatch: pytest.MonkeyPatch, devices: list[FakeDevice]) -> types.ModuleType:
    """A fake ``pynvml`` module over `devices`, importable as ``pynvml`` until the test ends.
    ``module.calls`` records every call's name."""
    module = types.ModuleType("pynvml")
    calls: list[str] = []

    def recorded(name: str, answer: Any) -> None:
        def call(*args: Any) -> Any:
            calls.append(name)
            return answer(*args)

        setattr(module, name, call)

    def power_limit(device: FakeDevice) -> int:
        if device.power_limit_mw is None:
            raise NVMLError("Not Supported")
        return device.power_limit_mw

    recorded("nvmlInit", lambda: None)
    recorded("nvmlShutdown", lambda: None)
    recorded("nvmlDeviceGetCount", lambda: len(devices))
    recorded("nvmlDeviceGetHandleByIndex", lambda index: devices[index])
    recorded("nvmlDeviceGetUUID", lambda device: device.uuid)
    recorded("nvmlDeviceGetName", lambda device: device.name.encode())
    recorded("nvmlDeviceGetMemoryInfo", lambda device: _Memory(device.memory_total))
    recorded("nvmlDeviceGetClockInfo", lambda device, kind: device.clocks[kind])
    recorded("nvmlDeviceGetMaxClockInfo", lambda device, kind: device.max_clocks[kind])
    recorded("nvmlDeviceGetPowerManagementLimit", power_limit)
    recorded("nvmlDeviceGetPowerManagementDefaultLimit", lambda device: device.power_default_mw)
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.NVML_CLOCK_SM = NVML_CLOCK_SM  # type: ignore[attr-defined]
    module.NVML_CLOCK_MEM = NVML_CLOCK_MEM  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module
