"""GPU inventories: virtual ones everywhere, NVML where a GPU exists."""

from __future__ import annotations

import logging

import pytest

from kernelfleet.kernels.agent.fingerprint import configured
from kernelfleet.kernels.agent.gpus import (
    GpuDevice,
    GpuUnavailable,
    NvmlInventory,
    VirtualInventory,
    make_inventory,
)


def nvml_error() -> str | None:
    """Why NVML cannot be used here, or None if it can."""
    try:
        NvmlInventory()
    except GpuUnavailable as e:
        return str(e)
    return None


def test_virtual_inventory_is_stable_per_host() -> None:
    devices = VirtualInventory(3, "host-a").devices()
    assert [d.index for d in devices] == [0, 1, 2]
    assert [d.uuid for d in devices] == [f"GPU-virtual-host-a-{i}" for i in range(3)]
    assert all(d.virtual and d.memory_total_mib > 0 for d in devices)
    assert VirtualInventory(3, "host-a").devices() == devices
    assert {d.uuid for d in VirtualInventory(3, "host-b").devices()}.isdisjoint(
        d.uuid for d in devices
    )
    assert devices[0].to_dict() == {
        "index": 0,
        "uuid": "GPU-virtual-host-a-0",
        "name": "kernelfleet virtual GPU",
        "memory_total_mib": 16384,
        "virtual": True,
        "fingerprint": configured(1.0).to_dict(),
    }


def test_gpu_device_is_frozen() -> None:
    device = GpuDevice(0, "u", "n", 1, virtual=True)
    with pytest.raises(AttributeError):
        device.index = 1  # type: ignore[misc]


def test_virtual_count_wins_in_auto_and_virtual() -> None:
    assert len(make_inventory("auto", 2, "h").devices()) == 2
    assert len(make_inventory("virtual", 4, "h").devices()) == 4
    assert make_inventory("virtual", None, "h").devices() == []
    assert make_inventory("auto", 0, "h").devices() == []


def test_bad_inventory_requests() -> None:
    with pytest.raises(ValueError, match="unknown GPU inventory"):
        make_inventory("docker", None, "h")
    with pytest.raises(ValueError, match="cannot be combined"):
        make_inventory("nvml", 2, "h")
    with pytest.raises(ValueError, match="negative"):
        VirtualInventory(-1, "h")


def test_auto_without_nvml_offers_no_gpus(caplog: pytest.LogCaptureFixture) -> None:
    if nvml_error() is None:
        pytest.skip("NVML works on this machine: 'auto' finds the real GPUs")
    with caplog.at_level(logging.INFO, logger="kernelfleet.host.gpus"):
        inventory = make_inventory("auto", None, "h")
    assert inventory.devices() == []
    lines = [r for r in caplog.records if r.name == "kernelfleet.host.gpus"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert "NVML" in lines[0].getMessage()
    with pytest.raises(GpuUnavailable):
        make_inventory("nvml", None, "h")


@pytest.mark.gpu
def test_nvml_lists_the_real_gpus() -> None:
    why = nvml_error()
    if why is not None:
        pytest.skip(f"no NVML here: {why}")
    devices = make_inventory("nvml", None, "h").devices()
    assert devices, "NVML initialised but reported no GPU"
    assert [d.index for d in devices] == list(range(len(devices)))
    for device in devices:
        assert device.uuid.startswith("GPU-")
        assert device.name
        assert device.memory_total_mib > 1024
        assert not device.virtual
    assert make_inventory("auto", None, "h").devices() == devices
