"""Per-GPU fingerprints: NVML readings through a fake pynvml, the torch measurement in its child
process (here without CUDA, so it must say why), and virtual GPUs' configured speeds."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch

from kernelfleet.kernels.agent.fingerprint import (
    GpuFingerprint,
    combine,
    copy_gb_s,
    matmul_tflops,
    measure_in_child,
    parse_speeds,
)
from kernelfleet.kernels.agent.gpus import NvmlInventory, make_inventory
from tests.kernels import fake_pynvml_devices as fake_pynvml
from tests.kernels.fake_pynvml_devices import FakeDevice


def test_nvml_inventory_fingerprints_each_gpu_and_says_why_matmul_did_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = fake_pynvml.install(
        monkeypatch,
        [FakeDevice("GPU-aaaa"), FakeDevice("GPU-bbbb", power_limit_mw=None)],
    )
    devices = NvmlInventory(measure_timeout=60).devices()  # the real child; no CUDA here
    assert [device.uuid for device in devices] == ["GPU-aaaa", "GPU-bbbb"]
    first, second = (device.fingerprint for device in devices)
    assert first is not None
    assert second is not None
    assert first.source == "unmeasured"
    assert (first.sm_clock_max_mhz, first.sm_clock_mhz) == (1980, 345)
    assert (first.mem_clock_max_mhz, first.mem_clock_mhz) == (2619, 2619)
    assert (first.power_limit_w, first.power_default_w) == (700.0, 700.0)
    assert (first.matmul_fp16_tflops, first.copy_gb_s) == (None, None)
    assert any("no CUDA device" in note for note in first.notes), first.notes
    assert first.measured_s is not None
    assert first.measured_s >= 0
    assert (second.power_limit_w, second.power_default_w) == (None, 700.0)
    assert any(note.startswith("power_limit_w: NVML: Not Supported") for note in second.notes)
    assert fake.calls.count("nvmlShutdown") == 1
    assert json.loads(json.dumps(devices[0].to_dict()))["fingerprint"]["notes"] == list(first.notes)


def test_measured_figures_make_a_measured_fingerprint() -> None:
    readings = {"sm_clock_max_mhz": 1980, "power_limit_w": 700.0}
    figures = {"GPU-a": {"matmul_fp16_tflops": 610.5, "copy_gb_s": 2800.0, "notes": []}}
    fingerprint = combine("GPU-a", readings, [], figures, 3.2)
    assert fingerprint == GpuFingerprint(
        "measured",
        matmul_fp16_tflops=610.5,
        copy_gb_s=2800.0,
        sm_clock_max_mhz=1980,
        power_limit_w=700.0,
        measured_s=3.2,
    )
    missing = combine("GPU-b", readings, ["why"], figures, 3.2)
    assert missing.source == "unmeasured"
    assert missing.notes == ("why", "matmul/copy: not measured (see the other notes)")


def test_a_stuck_or_failing_child_is_a_note_not_a_failure(tmp_path: Path) -> None:
    stuck = tmp_path / "stuck-python"
    stuck.write_text("#!/bin/sh\nsleep 10\n")
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'CUDA error: out of memory' >&2\nexit 3\n")
    for script in (stuck, failing):
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert measure_in_child(timeout=0.5, python=str(stuck)) == (
        {},
        ["matmul/copy: the measurement took over 0.5 s and was stopped"],
    )
    assert measure_in_child(python=str(failing)) == (
        {},
        ["matmul/copy: the measurement failed (exit 3): CUDA error: out of memory"],
    )
    assert measure_in_child(python=str(tmp_path / "absent"))[1][0].startswith(
        "matmul/copy: could not start the measurement"
    )


def test_the_benchmarks_count_operations_and_bytes_on_any_device() -> None:
    cpu = torch.device("cpu")
    assert matmul_tflops(torch, cpu, torch.float32, 128, 2) > 0
    assert copy_gb_s(torch, cpu, 1, 2) > 0


def test_virtual_gpus_carry_their_configured_speed() -> None:
    devices = make_inventory("auto", 2, "h", gpu_speed="0.5,1.25").devices()
    assert [d.fingerprint for d in devices] == [
        GpuFingerprint("configured", speed_factor=0.5),
        GpuFingerprint("configured", speed_factor=1.25),
    ]
    same = make_inventory("virtual", 3, "h", gpu_speed="0.8").devices()
    assert {d.fingerprint.speed_factor for d in same if d.fingerprint} == {0.8}
    plain = make_inventory("virtual", 1, "h").devices()[0]
    assert plain.to_dict()["fingerprint"]["speed_factor"] == 1.0


@pytest.mark.parametrize(
    ("text", "count", "error"),
    [
        ("fast", 2, "a number or a comma list"),
        ("1.0,0", 2, "positive"),
        ("1,2,3", 2, "3 factors for 2 virtual GPU"),
        ("-1", 1, "positive"),
        ("nan", 1, "positive"),
    ],
)
def test_bad_gpu_speeds(text: str, count: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_speeds(text, count)


def test_gpu_speed_needs_virtual_gpus() -> None:
    assert parse_speeds("", 2) == [1.0, 1.0]
    with pytest.raises(ValueError, match="configures virtual GPUs"):
        make_inventory("nvml", None, "h", gpu_speed="0.5")
    with pytest.raises(ValueError, match="configures virtual GPUs"):
        make_inventory("auto", None, "h", gpu_speed="0.5")
