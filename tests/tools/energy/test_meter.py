"""`EnergyMeter` at the pynvml boundary (a fake of NVML's API over simulated GPUs): energy per
GPU from the total-energy counters, and time only, saying why, where they cannot be read."""

import sys

import pytest

from kernelfleet.tools.energy.meter import EnergyMeter, bound_gpus

from .conftest import FakeNvml, SimulatedGpu


def test_energy_per_gpu_is_the_counters_difference_over_the_run(gpus):
    nvml = FakeNvml(gpus)
    meter = EnergyMeter(["0", "1"], nvml)
    measurement, value = meter.measure(lambda: gpus[0].run(0.05) or 42, items=8)
    assert value == 42
    assert meter.why is None
    assert measurement.latency_s >= 0.05
    first, second = measurement.per_gpu
    assert (first.index, second.index) == (0, 1)
    # busy at 700 W for 50 ms against 60 W idle: each within the time actually measured
    assert 700 * 0.05 <= first.energy_j <= 700 * measurement.latency_s + 1
    assert 60 * 0.05 <= second.energy_j <= 60 * measurement.latency_s + 1
    assert measurement.energy_j == pytest.approx(first.energy_j + second.energy_j)
    assert measurement.energy_per_item_j == pytest.approx(measurement.energy_j / 8)
    assert nvml.initialised == 0  # NVML shut down again


def test_a_lower_power_limit_shows_as_less_power_and_more_time():
    fast, slow = SimulatedGpu(0), SimulatedGpu(0)
    slow.power_limit = 200.0
    results = [
        EnergyMeter([0], FakeNvml([g])).measure(lambda g=g: g.run(0.04))[0] for g in (fast, slow)
    ]
    assert results[1].latency_s > results[0].latency_s
    assert results[1].energy_j / results[1].latency_s < results[0].energy_j / results[0].latency_s


@pytest.mark.parametrize(
    ("devices", "nvml", "why"),
    [
        ([], FakeNvml([SimulatedGpu(0)]), "no GPU is bound to this cell"),
        (["0"], FakeNvml([SimulatedGpu(0)], driver=False),
         "NVML did not start (Driver Not Loaded)"),
        (["0"], FakeNvml([SimulatedGpu(0)], counter=False),
         "GPU 0 has no total-energy counter (Not Supported)"),
        (["gpu-a"], FakeNvml([SimulatedGpu(0)]), "the bound devices gpu-a are not NVML indices"),
    ],
)  # fmt: skip
def test_without_counters_the_run_is_timed_and_the_reason_given(devices, nvml, why):
    ran = []
    measurement, _ = EnergyMeter(devices, nvml).measure(lambda: ran.append(1))
    assert ran == [1]
    assert measurement.latency_s >= 0
    assert measurement.energy_j is None
    assert measurement.per_gpu == ()
    meter = EnergyMeter(devices, nvml)
    meter.measure(lambda: None)
    assert meter.why is not None
    assert meter.why.startswith(why)
    assert nvml.initialised == 0


def test_without_pynvml_the_reason_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    meter = EnergyMeter(["0"])
    measurement, _ = meter.measure(lambda: None)
    assert measurement.energy_j is None
    assert meter.why == "pynvml is not installed (pip install nvidia-ml-py)"


def test_an_error_in_the_run_propagates_and_nvml_is_shut_down(gpus):
    nvml = FakeNvml(gpus)
    with pytest.raises(ZeroDivisionError):
        EnergyMeter([0], nvml).measure(lambda: 1 / 0)
    assert nvml.initialised == 0


def test_the_cells_gpus_come_from_kernelfleet_gpus():
    assert bound_gpus({"KERNELFLEET_GPUS": "2, 3"}) == ["2", "3"]
    assert bound_gpus({"KERNELFLEET_GPUS": ""}) == []
    assert EnergyMeter.for_cell({"KERNELFLEET_GPUS": "1"}).devices == ["1"]
