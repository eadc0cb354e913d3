"""The GPUs a host offers: real ones through NVML, or a configured number of virtual ones.

Everything above this module sees only ``GpuInventory.devices()`` and ``GpuDevice`` values, so a
host with virtual GPUs runs exactly the same code as a host with real ones.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Literal

from kernelfleet.kernels.agent.fingerprint import (
    MEASURE_TIMEOUT_S,
    GpuFingerprint,
    combine,
    configured,
    measure_in_child,
    nvml_readings,
    parse_speeds,
)

log = logging.getLogger("kernelfleet.host.gpus")

InventoryKind = Literal["auto", "nvml", "virtual"]
INVENTORY_KINDS: tuple[str, ...] = ("auto", "nvml", "virtual")

VIRTUAL_GPU_NAME = "kernelfleet virtual GPU"
VIRTUAL_GPU_MEMORY_MIB = 16384
VIRTUAL_GPU_TYPE = "virtual"
"""The GPU type virtual GPUs advertise unless the agent is given one (``--gpu-type``)."""


class GpuUnavailable(RuntimeError):
    """The requested inventory cannot be read on this machine (no NVML library, no driver)."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the fleet sees it.

    ``index`` is the device ordinal on this host (what ``CUDA_VISIBLE_DEVICES`` takes);
    ``uuid`` is stable across restarts of the agent and unique in the fleet. ``fingerprint``:
    how fast it is (`kernelfleet.kernels.agent.fingerprint`), None if nobody measured it.
    """

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    virtual: bool
    fingerprint: GpuFingerprint | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used in the host model and the gateway registration."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "virtual": self.virtual,
            "fingerprint": None if self.fingerprint is None else self.fingerprint.to_dict(),
        }


class GpuInventory(ABC):
    """The GPUs of one host.

    Contract: the agent builds one inventory at start-up (``make_inventory``) and calls
    ``devices()`` whenever it describes the host (every heartbeat), so ``devices()`` must be cheap
    and must not fail; an implementation reads the hardware once and answers from that snapshot.
    The list is ordered by ``index`` and is the same on every call for the life of the process.
    """

    kind: str = "abstract"

    @property
    def gpu_type(self) -> str:
        """The type the host advertises for its GPUs (what job schedulers group GPUs by): the
        first device's NVML name for real GPUs; ``"none"`` for a host without GPUs."""
        devices = self.devices()
        return devices[0].name if devices else "none"

    @abstractmethod
    def devices(self) -> list[GpuDevice]:
        """The host's GPUs, ordered by index."""


class VirtualInventory(GpuInventory):
    """``count`` virtual GPUs, for machines without GPUs and for tests.

    UUIDs are ``GPU-virtual-<host_id>-<index>``: stable for a host id, distinct across hosts.
    ``speeds``: each GPU's configured relative speed (``--gpu-speed``), 1.0 for all if None;
    it is the GPU's fingerprint.
    """

    kind = "virtual"

    def __init__(
        self,
        count: int,
        host_id: str,
        *,
        name: str = VIRTUAL_GPU_NAME,
        memory_total_mib: int = VIRTUAL_GPU_MEMORY_MIB,
        gpu_type: str = VIRTUAL_GPU_TYPE,
        speeds: list[float] | None = None,
    ) -> None:
        self._gpu_type = gpu_type
        if count < 0:
            raise ValueError(f"a virtual GPU count cannot be negative (got {count})")
        if speeds is not None and len(speeds) != count:
            raise ValueError(f"{len(speeds)} speed factor(s) for {count} virtual GPU(s)")
        self._devices = [
            GpuDevice(
                index=i,
                uuid=f"GPU-virtual-{host_id}-{i}",
                name=name,
                memory_total_mib=memory_total_mib,
                virtual=True,
                fingerprint=configured(1.0 if speeds is None else speeds[i]),
            )
            for i in range(count)
        ]

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    @property
    def gpu_type(self) -> str:
        """The configured type (``--gpu-type``), so a fleet of virtual GPUs can be mixed."""
        return self._gpu_type


class NvmlInventory(GpuInventory):
    """The real GPUs, read once through NVML (``nvidia-ml-py``, imported as ``pynvml``).

    The constructor initialises NVML, reads every device (with its clocks and power) and shuts
    NVML down again; it raises ``GpuUnavailable`` (with NVML's own explanation) when NVML cannot
    be initialised. With ``measure`` it then fingerprints the devices' speed through torch, in
    a child process given ``measure_timeout`` seconds (`kernelfleet.kernels.agent.fingerprint`);
    that never fails: what cannot be measured is noted in each fingerprint.
    """

    kind = "nvml"

    def __init__(self, measure: bool = True, measure_timeout: float = MEASURE_TIMEOUT_S) -> None:
        listed = _read_nvml_devices()
        measured: dict[str, dict[str, Any]] = {}
        notes = ["matmul/copy: not asked for"]
        began = time.monotonic()
        if measure and listed:
            measured, notes = measure_in_child(measure_timeout)
        took = round(time.monotonic() - began, 3)
        self._devices = [
            replace(
                device,
                fingerprint=combine(device.uuid, readings, [*read_notes, *notes], measured, took),
            )
            for device, (readings, read_notes) in listed
        ]
        for device in self._devices:
            log.info("GPU %d (%s): %s", device.index, device.uuid, device.fingerprint)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_NvmlListing = list[tuple[GpuDevice, tuple[dict[str, Any], list[str]]]]


def _read_nvml_devices() -> _NvmlListing:
    """Every device with its NVML clock and power readings and their notes."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise GpuUnavailable(f"NVML could not be initialised: {e}") from e
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            device = GpuDevice(
                index=i,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total_mib=int(memory.total) // (1024 * 1024),
                virtual=False,
            )
            devices.append((device, nvml_readings(pynvml, handle)))
        return devices
    except pynvml.NVMLError as e:
        raise GpuUnavailable(f"NVML failed while listing devices: {e}") from e
    finally:
        pynvml.nvmlShutdown()


def make_inventory(
    kind: str,
    virtual_count: int | None,
    host_id: str,
    gpu_type: str = VIRTUAL_GPU_TYPE,
    gpu_speed: str = "",
) -> GpuInventory:
    """Build the inventory the agent's configuration asks for.

    - ``virtual_count`` set (with kind ``auto`` or ``virtual``): that many virtual GPUs, of
      type `gpu_type`, with the speed factors `gpu_speed` gives (`parse_speeds`: one for all,
      or a comma list with one per GPU; empty: 1.0).
    - ``"virtual"`` without a count: no GPUs.
    - ``"nvml"``: the real GPUs, fingerprinted; raises ``GpuUnavailable`` if NVML does not work.
    - ``"auto"`` without a count: the real GPUs if NVML initialises, otherwise no GPUs, with one
      INFO line saying why.

    Raises ``ValueError`` for an unknown kind, for ``"nvml"`` combined with a virtual count,
    and for a `gpu_speed` that is malformed or given without virtual GPUs (real GPUs are
    measured, not configured).
    """
    if kind not in INVENTORY_KINDS:
        raise ValueError(
            f"unknown GPU inventory {kind!r}; choose one of {', '.join(INVENTORY_KINDS)}"
        )
    virtual = kind == "virtual" or (kind == "auto" and virtual_count is not None)
    if gpu_speed.strip() and not (virtual and virtual_count):
        raise ValueError(
            "--gpu-speed configures virtual GPUs (--gpus N); real GPUs are measured instead"
        )
    if kind == "nvml":
        if virtual_count is not None:
            raise ValueError("a virtual GPU count cannot be combined with the 'nvml' inventory")
        return NvmlInventory()
    if virtual:
        count = virtual_count or 0
        speeds = parse_speeds(gpu_speed, count)
        return VirtualInventory(count, host_id, gpu_type=gpu_type, speeds=speeds)
    try:
        return NvmlInventory()
    except GpuUnavailable as e:
        log.info(
            "No real GPUs on this host (%s); offering 0 GPUs. Use --gpus N for virtual ones.", e
        )
        return VirtualInventory(0, host_id)
