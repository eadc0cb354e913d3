"""Reading a training trace and recovering its notebook sessions.

The file is a CSV with the columns ``job_id,num_gpu,submit_time,iterations,model_name,duration,
interval``; times are in minutes. Events are written session by session, each session's events in
time order, but session ids are not in the file: a new session starts where an event begins before
the previous one has ended (a notebook runs one cell at a time) or where the GPU count changes.

Bad input never yields a silently wrong total: a structural problem (empty file, missing or unknown
columns) raises `TraceError`; a bad row raises `TraceError` naming its line, unless the caller
passes ``skip_bad_rows=True``, in which case each bad row is counted and described in
`Trace.skipped`.
"""

from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from kernelfleet.errors import InvalidRequest

log = logging.getLogger("kernelfleet.scheduler.trace")

COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
TRACE_HELP = f"The trace CSV: columns {','.join(COLUMNS)}; times in minutes."
"""The help of a ``--trace`` option, for every command that reads a trace."""


class TraceError(InvalidRequest):
    """The trace file cannot be used as it is; the message names the file and line."""

    reason = "invalid-trace"


@dataclass(frozen=True)
class TraceEvent:
    """One training event: a cell that holds ``gpus`` GPUs for ``duration_min`` minutes."""

    line: int
    job_id: str
    gpus: int
    submit_min: float
    duration_min: float
    model_name: str = ""

    @property
    def end_min(self) -> float:
        return self.submit_min + self.duration_min


@dataclass(frozen=True)
class Session:
    """A notebook session: consecutive events, one at a time, all with the same GPU count."""

    id: int
    gpus: int
    events: tuple[TraceEvent, ...]

    @property
    def start_min(self) -> float:
        return self.events[0].submit_min

    @property
    def end_min(self) -> float:
        return self.events[-1].end_min


@dataclass(frozen=True)
class Trace:
    """A parsed trace: its events in file order, the sessions recovered from them, the skips."""

    path: str
    events: tuple[TraceEvent, ...]
    sessions: tuple[Session, ...]
    skipped: tuple[str, ...] = field(default=())

    def select(self, start_min: float = 0.0, sessions: int = 0) -> Trace:
        """The slice that replay and simulation share: the sessions starting at or after trace
        minute `start_min`, earliest first (ties by session id), at most `sessions` of them (0:
        all). Sessions are recovered from the whole file first, so a slice never splits or joins
        one; they are renumbered 0.. in start order. `TraceError` if the slice is empty."""
        if start_min < 0 or sessions < 0:
            raise TraceError(
                f"{self.path}: start {start_min:g} and sessions {sessions} must be >= 0"
            )
        chosen = sorted(
            (s for s in self.sessions if s.start_min >= start_min),
            key=lambda s: (s.start_min, s.id),
        )
        if sessions:
            chosen = chosen[:sessions]
        if not chosen:
            raise TraceError(f"{self.path}: no session starts at or after minute {start_min:g}")
        renumbered = tuple(Session(i, s.gpus, s.events) for i, s in enumerate(chosen))
        events = tuple(e for s in renumbered for e in s.events)
        return Trace(self.path, events, renumbered, self.skipped)

    def gpu_split(self) -> dict[int, int]:
        """Events per GPU count, e.g. ``{1: 15214, 4: 6192, 8: 9503}`` for the June trace."""
        split: dict[int, int] = {}
        for event in self.events:
            split[event.gpus] = split.get(event.gpus, 0) + 1
        return dict(sorted(split.items()))


def read_trace(path: str | Path, *, skip_bad_rows: bool = False) -> Trace:
    """Parse `path` and recover its sessions.

    Raises `TraceError` for a missing, empty or header-only file, for missing or unknown columns,
    and (unless ``skip_bad_rows``) for the first bad row, naming its line number.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerate a byte-order mark
    except OSError as error:
        raise TraceError(f"cannot read trace {str(path)!r}: {error.strerror or error}") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise TraceError(f"{path}: the trace is empty (expected a header: {','.join(COLUMNS)})")
    _check_header(path, [cell.strip() for cell in header])
    events: list[TraceEvent] = []
    skipped: list[str] = []
    for line_no, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        try:
            events.append(_parse_row(line_no, row))
        except TraceError as error:
            if not skip_bad_rows:
                raise TraceError(f"{path}: {error.message}") from None
            skipped.append(error.message)
    if not events:
        raise TraceError(f"{path}: the trace has a header but no usable events")
    if skipped:
        log.warning("%s: skipped %d bad row(s); first: %s", path, len(skipped), skipped[0])
    return Trace(str(path), tuple(events), recover_sessions(events), tuple(skipped))


def _check_header(path: Path, header: list[str]) -> None:
    missing = [name for name in COLUMNS if name not in header]
    unknown = [name for name in header if name not in COLUMNS]
    if missing or unknown or len(header) != len(COLUMNS):
        raise TraceError(
            f"{path}, line 1: expected the columns {','.join(COLUMNS)}; "
            f"missing {missing or 'none'}, unknown {unknown or 'none'}"
        )
    if tuple(header) != COLUMNS:
        raise TraceError(f"{path}, line 1: columns must be in the order {','.join(COLUMNS)}")


def _parse_row(line_no: int, row: list[str]) -> TraceEvent:
    """One data row; `TraceError` says which line and which field is wrong."""
    if len(row) != len(COLUMNS):
        raise TraceError(f"line {line_no}: expected {len(COLUMNS)} fields, found {len(row)}")
    values = dict(zip(COLUMNS, (cell.strip() for cell in row), strict=True))
    gpus = _number(line_no, "num_gpu", values["num_gpu"])
    submit = _number(line_no, "submit_time", values["submit_time"])
    duration = _number(line_no, "duration", values["duration"])
    if gpus != int(gpus) or gpus < 1:
        raise TraceError(f"line {line_no}: num_gpu must be a positive integer, not {gpus:g}")
    if submit < 0:
        raise TraceError(f"line {line_no}: negative submit_time {submit:g}")
    if duration < 0:
        raise TraceError(f"line {line_no}: negative duration {duration:g}")
    return TraceEvent(
        line=line_no,
        job_id=values["job_id"],
        gpus=int(gpus),
        submit_min=submit,
        duration_min=duration,
        model_name=values["model_name"],
    )


def _number(line_no: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"line {line_no}: {column} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(f"line {line_no}: {column} is not finite: {text!r}")
    return value


def recover_sessions(events: list[TraceEvent] | tuple[TraceEvent, ...]) -> tuple[Session, ...]:
    """Split `events` (in file order) into sessions.

    A new session starts at the first event, where an event is submitted before the previous
    event ended, and where the GPU count changes. An event starting exactly when the previous one
    ends continues the session.
    """
    sessions: list[Session] = []
    current: list[TraceEvent] = []
    for event in events:
        if current and (event.submit_min < current[-1].end_min or event.gpus != current[-1].gpus):
            sessions.append(Session(len(sessions), current[0].gpus, tuple(current)))
            current = []
        current.append(event)
    if current:
        sessions.append(Session(len(sessions), current[0].gpus, tuple(current)))
    return tuple(sessions)
