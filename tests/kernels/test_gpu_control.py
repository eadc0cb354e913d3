"""Clocks and power limits: `NvmlGpuControl` against a fake of NVML's API (no GPU here), and
`VirtualGpuControl`, which runs the same plans on virtual devices."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from kernelfleet.errors import InvalidRequest, PermissionDenied
from kernelfleet.kernels.agent.gpu_control import (
    KNOBS,
    GpuControlFailed,
    GpuRanges,
    NvmlGpuControl,
    VirtualGpuControl,
    parse_settings,
    parse_virtual_ranges,
)
from kernelfleet.kernels.agent.gpus import GpuDevice

from .fake_pynvml import FakeGpu, FakeNvml

UUIDS = ("GPU-aaaa", "GPU-bbbb")


def devices() -> list[GpuDevice]:
    return [GpuDevice(i, uuid, "A100", 40960, virtual=False) for i, uuid in enumerate(UUIDS)]


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml([FakeGpu(uuid) for uuid in UUIDS])


@pytest.fixture
def control(nvml: FakeNvml) -> NvmlGpuControl:
    return NvmlGpuControl(devices(), nvml)


def test_the_fake_has_the_real_modules_names_and_arguments(nvml: FakeNvml) -> None:
    """What the control calls exists in nvidia-ml-py under that name with those parameters,
    so a typo or a renamed function fails here, not on the first real GPU."""
    functions = [name for name in dir(type(nvml)) if name.startswith("nvml")]
    assert len(functions) >= 15
    for name in functions:
        ours = list(inspect.signature(getattr(nvml, name)).parameters)
        theirs = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert ours == theirs, name


def test_set_locks_clocks_and_the_power_limit_in_nvmls_units(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    result = control.apply(
        list(UUIDS), {"gpu_clock_mhz": 1200, "mem_clock_mhz": 1215, "power_limit_w": 250.5}
    )
    assert result[0] == {
        "uuid": "GPU-aaaa",
        "index": 0,
        "applied": {"gpu_clock_mhz": 1200, "mem_clock_mhz": 1215, "power_limit_w": 250.5},
        "calls": [
            "nvmlDeviceSetGpuLockedClocks(0, 1200, 1200)",
            "nvmlDeviceSetMemoryLockedClocks(0, 1215, 1215)",
            "nvmlDeviceSetPowerManagementLimit(0, 250500)",
        ],
    }
    assert result[1]["calls"][0] == "nvmlDeviceSetGpuLockedClocks(1, 1200, 1200)"
    gpu = nvml.gpus["GPU-bbbb"]
    assert (gpu.gpu_locked, gpu.mem_locked, gpu.power_limit_mw) == (
        (1200, 1200),
        (1215, 1215),
        250500,
    )
    described = control.describe("GPU-bbbb")
    assert described["current"] == {
        "gpu_clock_mhz": 1200,
        "mem_clock_mhz": 1215,
        "power_limit_w": 250.5,
    }
    assert described["default"] == {
        "gpu_clock_mhz": 1410,
        "mem_clock_mhz": 1215,
        "power_limit_w": 400.0,
    }
    assert described["ranges"]["gpu_clock_mhz"][:3] == [210, 225, 240], "sorted, low first"
    assert described["ranges"]["power_limit_w"] == [100.0, 400.0]
    assert described["changed"] == {
        "gpu_clock_mhz": 1200,
        "mem_clock_mhz": 1215,
        "power_limit_w": 250.5,
    }


def test_reset_undoes_every_change_and_sets_the_default_power_limit(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    control.apply(list(UUIDS), {"gpu_clock_mhz": 900, "power_limit_w": 200})
    nvml.calls.clear()
    result = control.reset(list(UUIDS))
    assert result[0]["calls"] == [
        "nvmlDeviceSetPowerManagementLimit(0, 400000)",
        "nvmlDeviceResetGpuLockedClocks(0)",
    ]
    for gpu in nvml.gpus.values():
        assert gpu.gpu_locked is None
        assert gpu.power_limit_mw == 400_000
    assert control.changed("GPU-aaaa") == {}
    nvml.calls.clear()
    assert control.reset(list(UUIDS)) == [
        {"uuid": u, "index": i, "calls": []} for i, u in enumerate(UUIDS)
    ], "nothing changed: nothing to call"
    assert nvml.calls == []


def test_a_dry_run_lists_the_calls_and_changes_nothing(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    result = control.apply(["GPU-aaaa"], {"power_limit_w": 150, "gpu_clock_mhz": 705}, dry_run=True)
    assert result[0]["calls"] == [
        "nvmlDeviceSetGpuLockedClocks(0, 705, 705)",
        "nvmlDeviceSetPowerManagementLimit(0, 150000)",
    ]
    assert nvml.calls == [], "no NVML call that changes anything"
    assert nvml.gpus["GPU-aaaa"].power_limit_mw == 400_000
    assert control.changed("GPU-aaaa") == {}


def test_no_permission_is_a_clear_error_and_rolls_back_what_the_request_changed(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    nvml.refuse("nvmlDeviceSetPowerManagementLimit")
    with pytest.raises(PermissionDenied) as caught:
        control.apply(list(UUIDS), {"gpu_clock_mhz": 1005, "power_limit_w": 300})
    message = caught.value.message
    assert "NVML refused nvmlDeviceSetPowerManagementLimit(0, 300000)" in message
    assert "Insufficient Permissions" in message
    assert "root" in message
    assert nvml.calls == [
        "nvmlDeviceSetGpuLockedClocks(GPU-aaaa, 1005, 1005)",
        "nvmlDeviceSetPowerManagementLimit(GPU-aaaa, 300000)",
        "nvmlDeviceResetGpuLockedClocks(GPU-aaaa)",
    ], "the clock locked first was unlocked again; the second GPU was never touched"
    assert all(gpu.gpu_locked is None for gpu in nvml.gpus.values())
    assert control.changed("GPU-aaaa") == {}


def test_a_rollback_restores_an_earlier_requests_value_not_the_default(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    control.apply(["GPU-aaaa", "GPU-bbbb"], {"gpu_clock_mhz": 900})
    nvml.gpus["GPU-bbbb"].power_max_mw = 200_000  # the second GPU's driver refuses 300 W
    with pytest.raises(GpuControlFailed):
        control.apply(["GPU-aaaa", "GPU-bbbb"], {"gpu_clock_mhz": 1200, "power_limit_w": 300})
    assert [gpu.gpu_locked for gpu in nvml.gpus.values()] == [(900, 900), (900, 900)]
    assert nvml.gpus["GPU-aaaa"].power_limit_mw == 400_000
    assert control.changed("GPU-aaaa") == {"gpu_clock_mhz": 900}


def test_a_failed_rollback_is_named_in_the_error(nvml: FakeNvml, control: NvmlGpuControl) -> None:
    nvml.refuse("nvmlDeviceSetPowerManagementLimit")
    nvml.refuse("nvmlDeviceResetGpuLockedClocks")
    with pytest.raises(PermissionDenied, match=r"undoing failed too.*gpu_clock_mhz of GPU 0"):
        control.apply(["GPU-aaaa"], {"gpu_clock_mhz": 1005, "power_limit_w": 300})
    assert control.changed("GPU-aaaa") == {"gpu_clock_mhz": 1005}, "kept, so a reset retries"


def test_values_outside_the_ranges_are_refused_before_any_call(
    nvml: FakeNvml, control: NvmlGpuControl
) -> None:
    with pytest.raises(InvalidRequest, match=r"power_limit_w=450 is outside .* 100 to 400 W"):
        control.apply(["GPU-aaaa"], {"gpu_clock_mhz": 900, "power_limit_w": 450})
    with pytest.raises(InvalidRequest, match=r"gpu_clock_mhz=1201 is not supported .*210 to 1410"):
        control.apply(["GPU-aaaa"], {"gpu_clock_mhz": 1201})
    with pytest.raises(InvalidRequest, match="supported: 1215 MHz"):
        control.apply(["GPU-aaaa"], {"mem_clock_mhz": 877})
    with pytest.raises(InvalidRequest, match="no GPU 'GPU-zzzz'"):
        control.apply(["GPU-zzzz"], {"gpu_clock_mhz": 900})
    with pytest.raises(InvalidRequest, match="unknown knob"):
        control.apply(["GPU-aaaa"], {"sm_clock_mhz": 900})
    assert nvml.calls == []


def test_without_memory_clock_locks_the_application_clocks_are_used(nvml: FakeNvml) -> None:
    """A pre-Ampere GPU (a V100) cannot lock its memory clock: NOT_SUPPORTED, then the
    application clocks with the highest graphics clock supported at that memory clock."""
    old = FakeGpu("GPU-volta", graphics_clocks=(135, 1380, 1530), mem_clocks=(877,),
                  mem_locks_supported=False)  # fmt: skip
    nvml.gpus[old.uuid] = old
    control = NvmlGpuControl([GpuDevice(0, old.uuid, "V100", 16384, virtual=False)], nvml)
    result = control.apply([old.uuid], {"mem_clock_mhz": 877})
    assert result[0]["calls"] == ["nvmlDeviceSetApplicationsClocks(0, 877, 1530)"]
    assert old.applications == (877, 1530)
    dry = control.apply([old.uuid], {"mem_clock_mhz": 877}, dry_run=True)
    assert dry[0]["calls"] == ["nvmlDeviceSetApplicationsClocks(0, 877, 1530)"], "learned"
    assert control.reset([old.uuid])[0]["calls"] == ["nvmlDeviceResetApplicationsClocks(0)"]
    assert old.applications is None


def test_a_restarted_agent_resets_what_it_adopts(nvml: FakeNvml) -> None:
    """A previous agent left a memory clock locked on a pre-Ampere GPU (application clocks):
    a reset of the memory lock falls back to resetting the application clocks."""
    old = FakeGpu(
        "GPU-volta", graphics_clocks=(1380,), mem_clocks=(877,), mem_locks_supported=False
    )
    old.applications = (877, 1380)
    nvml.gpus[old.uuid] = old
    control = NvmlGpuControl([GpuDevice(0, old.uuid, "V100", 16384, virtual=False)], nvml)
    control.adopt(old.uuid, {"mem_clock_mhz": 877, "bogus": 1})
    assert control.changed(old.uuid) == {"mem_clock_mhz": 877}
    assert control.reset([old.uuid])[0]["calls"] == ["nvmlDeviceResetApplicationsClocks(0)"]
    assert old.applications is None


def test_nvml_that_cannot_start_is_a_clear_error(nvml: FakeNvml) -> None:
    with pytest.raises(GpuControlFailed, match="by UUID"):
        NvmlGpuControl([GpuDevice(0, "GPU-gone", "A100", 1, virtual=False)], nvml)


def test_virtual_gpus_run_the_same_plans_and_record_them() -> None:
    ranges = GpuRanges((600, 900, 1200), (800, 1600), (50.0, 150.0))
    control = VirtualGpuControl(devices(), ranges)
    assert control.describe("GPU-aaaa")["current"] == {
        "gpu_clock_mhz": 1200,
        "mem_clock_mhz": 1600,
        "power_limit_w": 150.0,
    }
    control.apply(["GPU-bbbb"], {"mem_clock_mhz": 800, "power_limit_w": 75})
    assert control.describe("GPU-bbbb")["current"]["power_limit_w"] == 75.0
    assert control.calls == [
        "nvmlDeviceSetMemoryLockedClocks(1, 800, 800)",
        "nvmlDeviceSetPowerManagementLimit(1, 75000)",
    ]
    control.reset(["GPU-bbbb"])
    assert control.describe("GPU-bbbb")["current"] == control.describe("GPU-bbbb")["default"]


def test_a_virtual_gpu_may_refuse_as_a_non_root_agent_is_refused() -> None:
    control = VirtualGpuControl(devices(), permitted=False)
    with pytest.raises(PermissionDenied, match="Insufficient Permissions"):
        control.apply(["GPU-aaaa"], {"power_limit_w": 200})
    assert control.changed("GPU-aaaa") == {}


def test_settings_bodies_are_checked() -> None:
    assert parse_settings({"gpu_clock_mhz": 900, "power_limit_w": None}) == {"gpu_clock_mhz": 900}
    with pytest.raises(InvalidRequest, match="unknown knob"):
        parse_settings({"gpu_clock_mhz": 900, "sm_clock_mhz": 900})
    assert parse_settings({"power_limit_w": 250}) == {"power_limit_w": 250.0}
    for bad in ({}, {"gpu_clock_mhz": "fast"}, {"gpu_clock_mhz": 900.5}, {"power_limit_w": -1},
                {"mem_clock_mhz": True}, {"power_limit_w": float("nan")}):  # fmt: skip
        with pytest.raises(InvalidRequest):
            parse_settings(bad)
    assert set(KNOBS) == {"gpu_clock_mhz", "mem_clock_mhz", "power_limit_w"}


def test_virtual_ranges_are_configurable() -> None:
    ranges = parse_virtual_ranges('{"mem_clock_mhz": [1600, 800], "power_limit_w": [50, 150]}')
    assert ranges.mem_clock_mhz == (800, 1600)
    assert ranges.gpu_clock_mhz[-1] == 1410, "the default's"
    for bad in ("[1]", '{"x": [1]}', '{"power_limit_w": [200, 100]}', '{"gpu_clock_mhz": []}', "{"):
        with pytest.raises(ValueError, match=r"virtual GPU ranges|must be"):
            parse_virtual_ranges(bad)
