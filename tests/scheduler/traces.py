"""Small hand-written traces for the scheduler tests: in memory, or as a CSV file to read."""

from __future__ import annotations

from pathlib import Path

from kernelfleet.scheduler.trace import Trace, TraceEvent, recover_sessions

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
"""The columns of the published traces (Adobe's Sensei traces), as `read_trace` expects them."""


def trace(*events: tuple[int, float, float]) -> Trace:
    """Events as (gpus, submit minute, duration minutes), in file order."""
    parsed = tuple(
        TraceEvent(line=i + 2, job_id=str(i), gpus=g, submit_min=s, duration_min=d)
        for i, (g, s, d) in enumerate(events)
    )
    return Trace("literal", parsed, recover_sessions(parsed))


def write_trace(path: Path, body: str, header: str = HEADER) -> Path:
    """A CSV trace at `path`: `header`, then `body`, rows as they stand in a file."""
    path.write_text(header + body, encoding="utf-8")
    return path
