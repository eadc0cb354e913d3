"""Relative GPU speeds from fingerprints, and the ledger's preference for faster free devices."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.gpu_speeds import (
    SpeedBasis,
    checked_gpus,
    parse_fingerprint,
    relative_speeds,
    speed_bases,
)
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.kernels.agent.fingerprint import GpuFingerprint, configured
from kernelfleet.kernels.agent.gpus import GpuDevice, VirtualInventory


def measured(fp16: float | None, fp32: float | None = None) -> GpuFingerprint:
    return GpuFingerprint("measured", matmul_fp16_tflops=fp16, matmul_fp32_tflops=fp32)


def gpu(index: int, fingerprint: GpuFingerprint | None) -> dict[str, object]:
    return GpuDevice(index, f"GPU-{index}", "H100", 81559, False, fingerprint).to_dict()


def test_an_agents_fingerprint_reads_back_whole() -> None:
    for fingerprint in (
        configured(0.5),
        GpuFingerprint("unmeasured", sm_clock_max_mhz=1980, power_limit_w=700.0, notes=("x",)),
        measured(600.0, 50.0),
    ):
        assert parse_fingerprint(fingerprint.to_dict()) == fingerprint.to_dict()
    assert parse_fingerprint(None) is None
    assert parse_fingerprint({"source": "configured", "speed_factor": 2, "extra": 1}) == {
        **GpuFingerprint("configured").to_dict(),
        "speed_factor": 2,
    }


@pytest.mark.parametrize(
    ("fingerprint", "error"),
    [
        ("fast", "'source' is one of"),
        ({"source": "guessed"}, "'source' is one of"),
        ({"source": "measured", "matmul_fp16_tflops": -1}, "'matmul_fp16_tflops'"),
        ({"source": "measured", "copy_gb_s": "fast"}, "'copy_gb_s'"),
        ({"source": "measured", "sm_clock_mhz": 1.5}, "'sm_clock_mhz' must be a non-negative int"),
        ({"source": "configured", "speed_factor": True}, "'speed_factor'"),
        ({"source": "configured", "speed_factor": float("inf")}, "'speed_factor'"),
        ({"source": "measured", "notes": [1]}, "'notes'"),
    ],
)
def test_malformed_fingerprints_are_refused(fingerprint: object, error: str) -> None:
    with pytest.raises(InvalidRequest, match=error):
        checked_gpus([{"index": 0, "fingerprint": fingerprint}])


def test_measured_speed_is_relative_to_the_median_of_its_type() -> None:
    a100 = {"0": SpeedBasis("A100", fp16_tflops=200.0), "1": SpeedBasis("A100", fp16_tflops=180.0)}
    hosts = {
        "h1": a100,
        "h2": {"0": SpeedBasis("A100", fp16_tflops=240.0), "1": SpeedBasis("A100")},
        "h3": {"0": SpeedBasis("H100", fp16_tflops=600.0), "1": SpeedBasis("H100", fp32_tflops=40)},
        "h4": {"0": SpeedBasis("H100", configured=0.5, fp16_tflops=1.0)},
    }
    assert relative_speeds(hosts) == {
        "h1": {"0": 1.0, "1": 0.9},  # the A100 median is 200
        "h2": {"0": 1.2, "1": 1.0},  # no figure: a typical GPU of its type
        "h3": {"0": 1.0, "1": 1.0},  # the only H100s measured, each in its own precision
        "h4": {"0": 0.5},  # a configured factor wins
    }


def test_speed_bases_come_from_the_host_report() -> None:
    gpus = [gpu(0, measured(300.0)), gpu(1, configured(0.7)), gpu(2, None)]
    assert speed_bases(checked_gpus(gpus), "H100") == {
        "0": SpeedBasis("H100", fp16_tflops=300.0),
        "1": SpeedBasis("H100", configured=0.7),
        "2": SpeedBasis("H100"),
    }


def ledger_of(speeds: str, *, lent: tuple[str, ...] = ()) -> GpuLedger:
    """One host `h` whose virtual GPUs have the configured `speeds`, and a replica on it."""
    factors = [float(factor) for factor in speeds.split(",")]
    devices = VirtualInventory(len(factors), "h", speeds=factors).devices()
    gpus = checked_gpus([device.to_dict() for device in devices])
    ledger = GpuLedger(checked=True)
    ledger.set_host("h", [str(i) for i in range(len(factors))], speed_bases(gpus, "virtual"))
    for name in ("r1", "r2"):
        ledger.subscribe("h", "k" + name, name, 1)
    if lent:
        ledger.lend("h", lent, "job-1")
    return ledger


def test_a_cell_gets_the_fastest_free_gpu() -> None:
    ledger = ledger_of("0.5,1.0,0.8")
    assert ledger.speeds("h") == {"0": 0.5, "1": 1.0, "2": 0.8}
    assert ledger.host_snapshot("h").free_gpu_speeds == (1.0, 0.8, 0.5)
    assert ledger.commit("h", "kr1", "r1", "c1", 2).device_ids == ("1", "2")
    assert ledger.host_snapshot("h").free_gpu_speeds == (0.5,)
    assert ledger.host_snapshot("h").free_speed(1) == 0.5
    assert ledger.breaches == 0


def test_own_warm_memory_comes_before_speed_and_speed_before_others_warm_memory() -> None:
    ledger = ledger_of("0.5,1.0,0.8")
    ledger.commit("h", "kr1", "r1", "c1", 1)  # device 1, the fastest
    ledger.release("kr1", cell_id="c1")  # r1's memory stays warm on device 1
    # r2 is not warm anywhere: the fastest still, though r1 is warm there (it will offload)
    taken = ledger.commit("h", "kr2", "r2", "c2", 1)
    assert (taken.device_ids, taken.displaced) == (("1",), (("kr1", "r1"),))
    ledger.release("kr2", cell_id="c2")
    # r2 is warm on 1 now: it goes back there; r1 gets the next fastest, no one's warm memory
    assert ledger.commit("h", "kr2", "r2", "c3", 1).device_ids == ("1",)
    assert ledger.commit("h", "kr1", "r1", "c4", 1).device_ids == ("2",)


def test_equal_speeds_keep_the_host_order_and_lent_devices_come_last() -> None:
    assert ledger_of("1.0,1.0,1.0").commit("h", "kr1", "r1", "c", 2).device_ids == ("0", "1")
    ledger = ledger_of("0.5,1.0,0.8", lent=("1",))
    assert ledger.commit("h", "kr1", "r1", "c", 1).device_ids == ("2",)


def test_speeds_follow_the_fleet_as_hosts_come_and_go() -> None:
    ledger = GpuLedger()
    ledger.set_host("a", ["0"], {"0": SpeedBasis("A100", fp16_tflops=100.0)})
    assert ledger.speeds("a") == {"0": 1.0}
    ledger.set_host("b", ["0"], {"0": SpeedBasis("A100", fp16_tflops=300.0)})
    assert ledger.speeds("a") == {"0": 0.5}  # the median of 100 and 300 is 200
    ledger.drop_host("b")
    assert ledger.speeds("a") == {"0": 1.0}
    ledger.set_host("a", ["0", "1"])  # an agent without fingerprints: 1.0 each
    assert ledger.speeds("a") == {"0": 1.0, "1": 1.0}
