"""Relative GPU speeds: from the fingerprints host agents report to one factor per device.

Each GPU in a host report may carry a fingerprint (`kernelfleet.kernels.agent.fingerprint`).
`parse_fingerprint` checks one as a report brings it (the admin API shows it as it was kept).
`speed_bases` reduces a host's GPUs to what speed depends on (`SpeedBasis`), and
`relative_speeds` turns every host's bases into one factor per device:

- a virtual GPU's configured factor (``--gpu-speed``) is its speed;
- a measured GPU's speed is its matmul TFLOPS over the median TFLOPS of the measured GPUs of its
  type in the fleet (fp16 where measured, else fp32): 1.0 is a typical GPU of its type, 0.9 one
  10 % slower than that (the SC'22 variability study's spread within one SKU);
- a GPU with neither (not measured, or an agent that predates fingerprints) is 1.0.

Speeds compare GPUs of one type only: which type a job or cell wants is decided elsewhere (the
throughput tables, the policies); the speed says which GPU of that type to prefer.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest

FINGERPRINT_SOURCES = ("measured", "configured", "unmeasured")
FINGERPRINT_NUMBERS = (
    "speed_factor",
    "matmul_fp16_tflops",
    "matmul_fp32_tflops",
    "copy_gb_s",
    "power_limit_w",
    "power_default_w",
    "measured_s",
)
FINGERPRINT_INTEGERS = ("sm_clock_max_mhz", "sm_clock_mhz", "mem_clock_max_mhz", "mem_clock_mhz")
"""The fingerprint's figures: each a non-negative number (an integer for clocks) or null."""


@dataclass(frozen=True)
class SpeedBasis:
    """What one device's relative speed is derived from: its type, and a configured factor or
    measured matmul TFLOPS (either may be None)."""

    gpu_type: str
    configured: float | None = None
    fp16_tflops: float | None = None
    fp32_tflops: float | None = None


def parse_fingerprint(value: Any) -> dict[str, Any] | None:
    """A GPU's ``fingerprint`` from a host report, checked and with every field present (an
    absent figure is null; unknown fields are dropped). None for an absent or null one;
    `InvalidRequest` naming the field for a malformed one."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("source") not in FINGERPRINT_SOURCES:
        raise InvalidRequest(
            "a GPU's 'fingerprint' must be an object whose 'source' is one of "
            + ", ".join(FINGERPRINT_SOURCES)
        )
    parsed: dict[str, Any] = {"source": value["source"]}
    for name in (*FINGERPRINT_NUMBERS, *FINGERPRINT_INTEGERS):
        figure = value.get(name)
        integer = name in FINGERPRINT_INTEGERS
        kinds = int if integer else int | float
        if figure is not None and (
            isinstance(figure, bool)
            or not isinstance(figure, kinds)
            or not math.isfinite(figure)
            or figure < 0
        ):
            what = "integer" if integer else "number"
            raise InvalidRequest(f"fingerprint '{name}' must be a non-negative {what} or null")
        parsed[name] = figure
    notes = value.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        raise InvalidRequest("fingerprint 'notes' must be a list of strings")
    parsed["notes"] = notes
    return parsed


def checked_gpus(gpus: Sequence[Any]) -> list[Any]:
    """A report's ``gpus`` with each device's fingerprint checked (`parse_fingerprint`); items
    that are not objects are left for the ledger to refuse."""
    return [
        {**gpu, "fingerprint": parse_fingerprint(gpu.get("fingerprint"))}
        if isinstance(gpu, dict)
        else gpu
        for gpu in gpus
    ]


def speed_bases(gpus: Sequence[Mapping[str, Any]], gpu_type: str) -> dict[str, SpeedBasis]:
    """Device id (the index as a string, as the ledger names devices) -> its `SpeedBasis`, for
    a host whose GPUs are of `gpu_type` and whose fingerprints were checked."""
    bases = {}
    for gpu in gpus:
        fingerprint = gpu.get("fingerprint") or {}
        configured = fingerprint.get("speed_factor")
        bases[str(int(gpu["index"]))] = SpeedBasis(
            gpu_type,
            configured=configured if fingerprint.get("source") == "configured" else None,
            fp16_tflops=fingerprint.get("matmul_fp16_tflops") or None,
            fp32_tflops=fingerprint.get("matmul_fp32_tflops") or None,
        )
    return bases


def relative_speeds(
    hosts: Mapping[str, Mapping[str, SpeedBasis]],
) -> dict[str, dict[str, float]]:
    """Host -> device -> relative speed, for every device of `hosts` (see the module
    docstring); rounded to 3 decimals."""
    medians = _type_medians(hosts)
    speeds: dict[str, dict[str, float]] = {}
    for host_id, devices in hosts.items():
        speeds[host_id] = {}
        for device, basis in devices.items():
            speed = 1.0
            if basis.configured is not None:
                speed = basis.configured
            elif basis.fp16_tflops is not None:
                speed = basis.fp16_tflops / medians[(basis.gpu_type, "fp16")]
            elif basis.fp32_tflops is not None:
                speed = basis.fp32_tflops / medians[(basis.gpu_type, "fp32")]
            speeds[host_id][device] = round(speed, 3)
    return speeds


def _type_medians(hosts: Mapping[str, Mapping[str, SpeedBasis]]) -> dict[tuple[str, str], float]:
    """(GPU type, precision) -> the median measured TFLOPS of the fleet's GPUs of that type."""
    measured: dict[tuple[str, str], list[float]] = defaultdict(list)
    for devices in hosts.values():
        for basis in devices.values():
            if basis.configured is not None:
                continue
            if basis.fp16_tflops is not None:
                measured[(basis.gpu_type, "fp16")].append(basis.fp16_tflops)
            if basis.fp32_tflops is not None:
                measured[(basis.gpu_type, "fp32")].append(basis.fp32_tflops)
    return {key: statistics.median(figures) for key, figures in measured.items()}
