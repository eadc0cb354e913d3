"""Per-GPU fingerprints: how fast each GPU of this host is, measured once when the agent starts.

GPUs of one model differ: the SC'22 study of GPU power management found about 8 % between
GPUs of the same SKU on average, and outliers up to 1.5x. The agent therefore measures every
real GPU at start and reports the figures in its host model; the gateway turns them into a
relative speed per GPU (`kernelfleet.gateway.gpu_speeds`).

What a real GPU's fingerprint holds (`GpuFingerprint`, JSON form `GpuFingerprint.to_dict`):

- through NVML, in the agent: SM and memory clocks (maximum and current, MHz) and the power
  limit and its default (W);
- through torch, in a child process (so the agent itself never holds a CUDA context, which would
  take GPU memory for the agent's whole life): the TFLOPS of a fixed square matmul (fp16 and
  fp32, `MATMUL_N`) and the bandwidth of a device-to-device copy (`COPY_MIB`; GB/s counting the
  bytes read and the bytes written). The child gets `MEASURE_TIMEOUT_S` seconds for all GPUs.

Nothing here fails the agent's start: a figure that cannot be read is None and ``notes`` says
why (no torch, no CUDA, NVML refused, timed out). Virtual GPUs are not measured: their
fingerprint is ``configured`` with the speed factor the agent was given (``--gpu-speed``).

Run as ``python -m kernelfleet.kernels.agent.fingerprint`` it is that child: it measures every
CUDA device and prints ``{uuid: {figure: value, ..., "notes": [...]}}`` as one JSON line.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

log = logging.getLogger("kernelfleet.host.fingerprint")

FingerprintSource = Literal["measured", "configured", "unmeasured"]

MATMUL_N = 4096
"""Side of the square matrices multiplied (2 n^3 floating-point operations per product)."""
MATMUL_REPEATS = {"fp16": 20, "fp32": 5}
COPY_MIB = 256
COPY_REPEATS = 10
MEASURE_TIMEOUT_S = 30.0
"""Seconds the torch child may take for all GPUs (importing torch and starting CUDA take most)."""

_MEASURED_FIGURES = ("matmul_fp16_tflops", "matmul_fp32_tflops", "copy_gb_s")


@dataclass(frozen=True)
class GpuFingerprint:
    """One GPU's speed figures, as the host model carries them (every figure may be None).

    ``source``: ``measured`` (a real GPU with at least one matmul figure), ``configured`` (a
    virtual GPU: ``speed_factor`` is its configured relative speed) or ``unmeasured`` (a real GPU
    whose matmul could not be run: ``notes`` says why). ``notes``: one line per thing that could
    not be read. ``measured_s``: wall seconds the measurement of this host's GPUs took.
    """

    source: FingerprintSource
    speed_factor: float | None = None
    matmul_fp16_tflops: float | None = None
    matmul_fp32_tflops: float | None = None
    copy_gb_s: float | None = None
    sm_clock_max_mhz: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    notes: tuple[str, ...] = field(default=())
    measured_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`notes` a list); the gateway's `parse_fingerprint` reads it back."""
        return {
            "source": self.source,
            "speed_factor": self.speed_factor,
            "matmul_fp16_tflops": self.matmul_fp16_tflops,
            "matmul_fp32_tflops": self.matmul_fp32_tflops,
            "copy_gb_s": self.copy_gb_s,
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "sm_clock_mhz": self.sm_clock_mhz,
            "mem_clock_max_mhz": self.mem_clock_max_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "power_limit_w": self.power_limit_w,
            "power_default_w": self.power_default_w,
            "notes": list(self.notes),
            "measured_s": self.measured_s,
        }


def configured(speed_factor: float, why: str | None = None) -> GpuFingerprint:
    """A virtual GPU's fingerprint: its configured relative speed (`why`, if given, as a note)."""
    return GpuFingerprint("configured", speed_factor=speed_factor, notes=(why,) if why else ())


def parse_speeds(text: str, count: int) -> list[float]:
    """``--gpu-speed``: one positive factor for every GPU, or a comma list with one per GPU.

    An empty text means 1.0 for all. `ValueError` (saying what is wrong) otherwise."""
    text = text.strip()
    if not text:
        return [1.0] * count
    try:
        factors = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--gpu-speed takes a number or a comma list of numbers, not {text!r}"
        ) from None
    if any(not 0 < factor < float("inf") for factor in factors):
        raise ValueError(f"every --gpu-speed factor must be a positive number, not {text!r}")
    if len(factors) == 1:
        return factors * count
    if len(factors) != count:
        raise ValueError(
            f"--gpu-speed lists {len(factors)} factors for {count} virtual GPU(s): give one "
            "for all, or one per GPU"
        )
    return factors


# ---- NVML: clocks and power ------------------------------------------------------------------


def nvml_readings(pynvml: Any, handle: Any) -> tuple[dict[str, Any], list[str]]:
    """Clocks and power of one device, read through `pynvml` with an open `handle`.

    Returns the `GpuFingerprint` fields read and a note for each reading NVML refused (a GPU
    that does not support one, say); never raises an NVML error."""
    readings: dict[str, Any] = {}
    notes: list[str] = []
    queries: dict[str, Callable[[], Any]] = {
        "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "mem_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(
            handle, pynvml.NVML_CLOCK_MEM
        ),
        "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        # NVML gives power in milliwatts
        "power_limit_w": lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "power_default_w": lambda: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000,
    }
    for name, query in queries.items():
        try:
            value = query()
        except pynvml.NVMLError as e:
            notes.append(f"{name}: NVML: {e}")
            continue
        readings[name] = float(value) if name.endswith("_w") else int(value)
    return readings, notes


def combine(
    uuid: str,
    readings: Mapping[str, Any],
    notes: Sequence[str],
    measured: Mapping[str, Mapping[str, Any]],
    measured_s: float | None,
) -> GpuFingerprint:
    """One real GPU's fingerprint from its NVML `readings` (and their `notes`) and what the torch
    child `measured` (by UUID; a GPU it did not report is noted as not measured)."""
    figures = measured.get(uuid)
    all_notes = list(notes)
    values = dict(readings)
    if figures is None:
        all_notes.append("matmul/copy: not measured (see the other notes)")
    else:
        all_notes.extend(str(note) for note in figures.get("notes", ()))
        values.update({name: figures[name] for name in _MEASURED_FIGURES if name in figures})
    ran = values.get("matmul_fp16_tflops") is not None or values.get("matmul_fp32_tflops")
    source: FingerprintSource = "measured" if ran else "unmeasured"
    return replace(GpuFingerprint(source, measured_s=measured_s, notes=tuple(all_notes)), **values)


# ---- torch: matmul and copy, in a child process ------------------------------------------------


def measure_in_child(
    timeout: float = MEASURE_TIMEOUT_S, python: str = sys.executable
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Run this module as a child and read its figures: ({uuid: figures}, notes for every GPU).

    Never raises: a child that cannot start, times out, fails or prints no JSON gives no
    figures and a note saying so."""
    command = [python, "-m", "kernelfleet.kernels.agent.fingerprint"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {}, [f"matmul/copy: the measurement took over {timeout:g} s and was stopped"]
    except OSError as e:
        return {}, [f"matmul/copy: could not start the measurement: {e}"]
    lines = done.stdout.strip().splitlines()
    try:
        parsed = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        parsed = None
    if done.returncode != 0 or not isinstance(parsed, dict):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, [f"matmul/copy: the measurement failed (exit {done.returncode}): {tail}"]
    notes = [str(note) for note in parsed.pop("_notes", [])]
    return {str(uuid): figures for uuid, figures in parsed.items()}, notes


def matmul_tflops(torch: Any, device: Any, dtype: Any, n: int, repeats: int) -> float:
    """TFLOPS of ``repeats`` products of two random n x n matrices on `device` (after one
    warm-up product), timed with the device synchronised before and after."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    seconds = _timed(torch, device, lambda: torch.matmul(a, b), repeats)
    return 2 * n**3 * repeats / seconds / 1e12


def copy_gb_s(torch: Any, device: Any, mib: int, repeats: int) -> float:
    """Device-to-device copy bandwidth of a `mib` MiB buffer in GB/s, counting the bytes read
    and the bytes written (as CUDA's bandwidthTest does)."""
    source = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = _timed(torch, device, lambda: target.copy_(source), repeats)
    return 2 * source.numel() * repeats / seconds / 1e9


def _timed(torch: Any, device: Any, work: Callable[[], Any], repeats: int) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda _device: None)
    synchronize(device)
    began = time.perf_counter()
    for _ in range(repeats):
        work()
    synchronize(device)
    return time.perf_counter() - began


def measure_cuda_devices() -> dict[str, Any]:
    """The child's work: every CUDA device's figures by UUID (``GPU-`` + torch's uuid), plus
    ``"_notes"`` for what stops all of them (no torch, no CUDA)."""
    try:
        import torch
    except ImportError as e:
        return {"_notes": [f"matmul/copy: torch cannot be imported ({e})"]}
    if not torch.cuda.is_available():
        return {"_notes": ["matmul/copy: torch sees no CUDA device"]}
    results: dict[str, Any] = {}
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}"
        results[uuid] = _measure_device(torch, device)
        torch.cuda.empty_cache()
    return results


def _measure_device(torch: Any, device: Any) -> dict[str, Any]:
    """One device's figures; a benchmark that fails is a note, and the others still run."""
    figures: dict[str, Any] = {"notes": []}
    benchmarks: dict[str, Callable[[], float]] = {
        "matmul_fp16_tflops": lambda: matmul_tflops(
            torch, device, torch.float16, MATMUL_N, MATMUL_REPEATS["fp16"]
        ),
        "matmul_fp32_tflops": lambda: matmul_tflops(
            torch, device, torch.float32, MATMUL_N, MATMUL_REPEATS["fp32"]
        ),
        "copy_gb_s": lambda: copy_gb_s(torch, device, COPY_MIB, COPY_REPEATS),
    }
    for name, benchmark in benchmarks.items():
        try:
            figures[name] = round(benchmark(), 3)
        except Exception as e:  # any failure (out of memory, a CUDA error) is this GPU's note
            figures["notes"].append(f"{name}: {type(e).__name__}: {e}")
    return figures


def main() -> None:
    torch_matmul_tf32_off()
    print(json.dumps(measure_cuda_devices()), flush=True)


def torch_matmul_tf32_off() -> None:
    """fp32 means fp32: keep TF32 off for the fp32 matmul (torch's default, stated here)."""
    try:
        import torch
    except ImportError:
        return
    torch.backends.cuda.matmul.allow_tf32 = False


if __name__ == "__main__":
    main()
