"""`FleetBackend` through a fake of the gateway's gpu-settings API (the `FleetClient` methods of
issue 14's contract) and the fake pynvml: the space, the settings it sends, the errors."""

import pytest

from kernelfleet.tools.energy.errors import NoGpuBound, SettingRefused, UnknownKnob
from kernelfleet.tools.energy.fleet import FleetBackend, power_steps
from kernelfleet.tools.energy.meter import EnergyMeter
from kernelfleet.tools.energy.tuner import tune

from .conftest import FakeGateway, FakeNvml


def backend_on(gpus, gateway, batches=()):
    def workload(batch):
        gpus[0].run(0.002 * (batch or 8) / 8 + 0.004)

    return FleetBackend(
        gateway, workload, batches=batches, meter=EnergyMeter([0, 1], FakeNvml(gpus))
    )


def test_the_space_is_what_every_bound_gpu_supports(gpus):
    backend = backend_on(gpus, FakeGateway(gpus), batches=[16, 8, 32])
    space = backend.space()
    assert space.names == ("gpu_clock", "mem_clock", "power_limit", "batch")
    clocks, mem, power, batch = space.knobs
    assert clocks.values == tuple(FakeGateway.CLOCKS)
    assert clocks.default == 1980.0
    assert mem.values == (2619.0,)
    assert power.values == power_steps(200.0, 700.0)
    assert power.values[0] == 200.0
    assert power.values[-1] == 700.0
    assert power.default == 700.0
    assert batch.values == (8.0, 16.0, 32.0)
    assert batch.default == 32.0


def test_power_steps_go_down_from_the_maximum():
    assert power_steps(100.0, 160.0) == (100.0, 110.0, 135.0, 160.0)


def test_tuning_sets_every_hardware_knob_and_leaves_the_best_applied(gpus):
    gateway = FakeGateway(gpus)
    backend = backend_on(gpus, gateway, batches=[8, 16, 32])
    result = tune(backend, slo_s=0.03, knobs=["gpu_clock", "power_limit"], evaluations=6, seed=0)
    changes = gateway.changes()
    assert changes[0] == ("reset", {})  # the default setting: unlocked clocks, full power
    assert all(set(c[1]) == {"gpu_clock_mhz", "power_limit_w", "dry_run"} for c in changes[1:-1])
    assert result.best is not None
    assert result.best.measurement.latency_s <= 0.03
    assert all(t.measurement.energy_j for t in result.trials)
    best = result.best.setting
    if best == result.space.default():
        assert changes[-1] == ("reset", {})
    else:
        assert changes[-1][1]["gpu_clock_mhz"] == best["gpu_clock"]
        assert (gpus[0].gpu_clock, gpus[0].power_limit) == (best["gpu_clock"], best["power_limit"])


def test_an_slo_nobody_meets_resets_the_gpus(gpus):
    gateway = FakeGateway(gpus)
    result = tune(backend_on(gpus, gateway), slo_s=1e-4, knobs=["power_limit"], evaluations=3)
    assert result.best is None
    assert gateway.changes()[-1] == ("reset", {})
    assert (gpus[0].gpu_clock, gpus[0].power_limit) == (1980.0, 700.0)


def test_no_gpu_bound_is_one_clear_error():
    with pytest.raises(NoGpuBound) as caught:
        backend_on([], FakeGateway([])).space()
    assert caught.value._render_traceback_() == [
        "NoGpuBound: no GPU is bound to this cell, so there is nothing to tune: run it with "
        "GPUs (%%gpus 1 on the cell's first line, or %gpus 1 for every later cell)"
    ]


def test_no_permission_is_one_clear_error_and_the_defaults_stay(gpus):
    gateway = FakeGateway(gpus, refuse=(403, "permission-denied"))
    backend = backend_on(gpus, gateway)
    with pytest.raises(SettingRefused) as caught:
        tune(backend, slo_s=1.0, knobs=["gpu_clock"], evaluations=5, seed=0)
    assert caught.value._render_traceback_() == [
        "SettingRefused: the host may not change this GPU's settings (NVML: Insufficient "
        "Permissions): nothing was changed"
    ]
    assert gateway.changes()[-1] == ("reset", {})
    assert (gpus[0].gpu_clock, gpus[0].power_limit) == (1980.0, 700.0)


def test_a_knob_the_gpus_lack_is_refused_with_those_they_have(gpus):
    backend = backend_on(gpus, FakeGateway(gpus))
    with pytest.raises(UnknownKnob, match="has no knob 'batch': it offers gpu_clock, mem_clock"):
        backend.space(["batch"])


def test_a_dry_run_returns_the_nvml_calls_and_changes_nothing(gpus):
    gateway = FakeGateway(gpus)
    backend = backend_on(gpus, gateway)
    devices = backend.dry_run({"gpu_clock": 990.0, "power_limit": 300.0})
    assert [d["calls"] for d in devices] == [
        [f"nvmlDeviceSetGpuLockedClocks({i}, 990, 990)",
         f"nvmlDeviceSetPowerManagementLimit({i}, 300000)"]
        for i in (0, 1)
    ]  # fmt: skip
    assert gateway.changes() == []
    assert gpus[0].gpu_clock == 1980.0
