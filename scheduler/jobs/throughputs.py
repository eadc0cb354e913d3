"""Gavel's throughput table: measured steps/s of each job type on each GPU type.

The JSON file (Gavel's ``physical_cluster_throughputs.json`` and ``simulation_throughputs.json``,
Shockwave's ``tacc_throughputs.json``) is read as it is::

    {gpu_type: {"('ResNet-18 (batch size 64)', 2)": {"null": 41.2,
                                                    "('LM (batch size 5)', 2)": [30.1, 12.7],
                                                    ...}}}

The key is the job type and its scale factor (GPUs it runs on); ``"null"`` is the throughput of the
whole job running alone, the other entries the pair of throughputs when co-located with another job
type (Gavel's packing, which this module reads but does not use). GPU types named
``*_unconsolidated`` are kept like any other; a cluster simply does not name them.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.errors import InvalidRequest


class ThroughputTableError(InvalidRequest):
    """The throughput file is unusable, or a lookup missed; the message names file and key."""

    reason = "invalid-throughputs"


JobTypeKey = tuple[str, int]
"""(job type as the trace writes it, scale factor)."""


def parse_key(text: str) -> JobTypeKey | None:
    """``"('LM (batch size 5)', 2)"`` -> ``("LM (batch size 5)", 2)``; None when malformed."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and value[1] >= 1
    ):
        return (value[0], value[1])
    return None


@dataclass(frozen=True)
class ThroughputTable:
    """Isolated throughputs, ``gpu_type -> (job type, scale factor) -> steps/s``."""

    isolated_by_gpu: Mapping[str, Mapping[JobTypeKey, float]]
    source: str = "<memory>"

    @classmethod
    def load(cls, path: str | Path) -> ThroughputTable:
        """Read a Gavel-format JSON file; `ThroughputTableError` names the file and bad key."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise ThroughputTableError(
                f"cannot read throughputs {path}: {error.strerror}"
            ) from None
        except json.JSONDecodeError as error:
            raise ThroughputTableError(f"{path} is not JSON: {error}") from None
        return cls.from_document(raw, source=str(path))

    @classmethod
    def from_document(cls, raw: object, source: str = "<memory>") -> ThroughputTable:
        if not isinstance(raw, dict) or not raw:
            raise ThroughputTableError(
                f"{source}: expected an object of GPU types, got {type(raw).__name__}"
            )
        table: dict[str, dict[JobTypeKey, float]] = {}
        for gpu_type, entries in raw.items():
            if not isinstance(entries, dict):
                raise ThroughputTableError(f"{source}: GPU type {gpu_type!r} is not an object")
            per_job: dict[JobTypeKey, float] = {}
            for text, measured in entries.items():
                key = parse_key(text)
                if key is None:
                    raise ThroughputTableError(
                        f"{source}: {gpu_type}: key {text!r} is not \"('job type', scale factor)\""
                    )
                isolated = measured.get("null") if isinstance(measured, dict) else None
                if isinstance(isolated, bool) or not isinstance(isolated, int | float):
                    raise ThroughputTableError(
                        f'{source}: {gpu_type}: {text}: no numeric isolated throughput ("null")'
                    )
                if isolated < 0:
                    raise ThroughputTableError(
                        f"{source}: {gpu_type}: {text}: negative throughput {isolated}"
                    )
                per_job[key] = float(isolated)
            table[gpu_type] = per_job
        return cls(table, source)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.isolated_by_gpu)

    def job_types(self) -> set[JobTypeKey]:
        return {key for per_job in self.isolated_by_gpu.values() for key in per_job}

    def isolated(self, job_type: str, scale_factor: int, gpu_type: str) -> float:
        """Steps/s of the whole job alone on ``scale_factor`` GPUs of ``gpu_type``."""
        per_job = self.isolated_by_gpu.get(gpu_type)
        if per_job is None:
            known = ", ".join(self.isolated_by_gpu)
            raise ThroughputTableError(f"{self.source}: no GPU type {gpu_type!r} (known: {known})")
        value = per_job.get((job_type, scale_factor))
        if value is None:
            raise ThroughputTableError(
                f"{self.source}: {gpu_type}: no throughput for job type {job_type!r} "
                f"on {scale_factor} GPU(s)"
            )
        return value

    def throughputs_for(
        self, job_type: str, scale_factor: int, gpu_types: Iterable[str]
    ) -> dict[str, float]:
        """The job's isolated throughput on each of ``gpu_types``."""
        return {gpu: self.isolated(job_type, scale_factor, gpu) for gpu in gpu_types}
