"""Reading job traces in Gavel's and Shockwave's formats.

Both are tab-separated, one job per line, no header, jobs in arrival order.

Gavel (10 columns): ``job_type, command, working_directory, num_steps_arg, needs_data_dir,
total_steps, scale_factor, priority_weight, SLO, arrival_time``.

Shockwave (12 columns): Gavel's, with ``mode`` (``static``, ``gns`` or ``accordion``: how the batch
size changes as the job trains) after ``scale_factor`` and ``duration`` (seconds the job takes
alone at its initial batch size, an integer) before ``arrival_time``.

``SLO`` is a multiple of the job's duration, negative for none; ``arrival_time`` is in seconds.
A malformed line raises `JobTraceError` naming the file, the 1-based line number and why.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.errors import InvalidRequest

GAVEL_COLUMNS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
SHOCKWAVE_COLUMNS = (*GAVEL_COLUMNS[:7], "mode", *GAVEL_COLUMNS[7:9], "duration", "arrival_time")
MODES = frozenset({"static", "gns", "accordion"})
JOB_TRACE_HELP = (
    "A job trace: Gavel's format (10 tab-separated columns) or Shockwave's (12: with the "
    "batch-size mode and the duration)."
)


class JobTraceError(InvalidRequest):
    """The job trace cannot be used; the message names the file and the line."""

    reason = "invalid-trace"


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, as written (``line`` is its 1-based line number)."""

    line: int
    job_type: str
    command: str
    working_directory: str
    num_steps_arg: str
    needs_data_dir: bool
    total_steps: int
    scale_factor: int
    priority_weight: float
    slo: float | None
    arrival_s: float
    mode: str = "static"
    duration_s: float | None = None


def read_job_trace(path: str | Path) -> tuple[TraceJob, ...]:
    """Read a trace in either format, told apart by each line's column count."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise JobTraceError(f"cannot read trace {path}: {error.strerror}") from None
    jobs = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        jobs.append(parse_line(raw, path, number))
    if not jobs:
        raise JobTraceError(f"{path}: no jobs in the trace")
    for previous, job in itertools.pairwise(jobs):
        if job.arrival_s < previous.arrival_s:
            raise JobTraceError(
                f"{path}:{job.line}: arrival {job.arrival_s:g} s is before the previous "
                f"line's {previous.arrival_s:g} s (jobs must be in arrival order)"
            )
    return tuple(jobs)


def parse_line(raw: str, path: str | Path, number: int) -> TraceJob:
    """One trace line in either format; `JobTraceError` says where and why it is malformed."""
    fields = raw.rstrip("\r\n").split("\t")
    names: tuple[str, ...]
    if len(fields) == len(GAVEL_COLUMNS):
        names = GAVEL_COLUMNS
    elif len(fields) == len(SHOCKWAVE_COLUMNS):
        names = SHOCKWAVE_COLUMNS
    else:
        raise JobTraceError(
            f"{path}:{number}: {len(fields)} tab-separated columns; expected "
            f"{len(GAVEL_COLUMNS)} (Gavel) or {len(SHOCKWAVE_COLUMNS)} (Shockwave)"
        )
    row = dict(zip(names, fields, strict=True))
    where = f"{path}:{number}"

    def number_of(column: str, kind: type[int] | type[float]) -> float:
        text = row[column].strip()
        try:
            value = kind(text)
        except ValueError:
            raise JobTraceError(f"{where}: {column} {text!r} is not {kind.__name__}") from None
        if not math.isfinite(value):
            raise JobTraceError(f"{where}: {column} {text!r} is not finite")
        return value

    if not row["job_type"].strip():
        raise JobTraceError(f"{where}: empty job_type")
    total_steps = int(number_of("total_steps", int))
    scale_factor = int(number_of("scale_factor", int))
    needs_data_dir = int(number_of("needs_data_dir", int))
    priority_weight = number_of("priority_weight", float)
    slo = number_of("SLO", float)
    arrival_s = number_of("arrival_time", float)
    if total_steps < 1:
        raise JobTraceError(f"{where}: total_steps {total_steps} must be at least 1")
    if scale_factor < 1:
        raise JobTraceError(f"{where}: scale_factor {scale_factor} must be at least 1")
    if needs_data_dir not in (0, 1):
        raise JobTraceError(f"{where}: needs_data_dir {needs_data_dir} must be 0 or 1")
    if priority_weight <= 0:
        raise JobTraceError(f"{where}: priority_weight {priority_weight:g} must be positive")
    if arrival_s < 0:
        raise JobTraceError(f"{where}: arrival_time {arrival_s:g} must not be negative")
    mode = "static"
    duration_s = None
    if names is SHOCKWAVE_COLUMNS:
        mode = row["mode"].strip()
        if mode not in MODES:
            raise JobTraceError(f"{where}: mode {mode!r} is not one of {', '.join(sorted(MODES))}")
        duration_s = number_of("duration", float)
        if duration_s < 0:
            raise JobTraceError(f"{where}: duration {duration_s:g} must not be negative")
    return TraceJob(
        line=number,
        job_type=row["job_type"],
        command=row["command"],
        working_directory=row["working_directory"],
        num_steps_arg=row["num_steps_arg"],
        needs_data_dir=bool(needs_data_dir),
        total_steps=total_steps,
        scale_factor=scale_factor,
        priority_weight=priority_weight,
        slo=slo if slo >= 0 else None,
        arrival_s=arrival_s,
        mode=mode,
        duration_s=duration_s,
    )
