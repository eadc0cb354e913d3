"""The replay schedule, as a pure function of a trace slice and the time scale.

Time scale X means X trace seconds per wall second: trace durations and idle gaps are divided
by X. What the gateway itself takes (starting a kernel, a message round trip) cannot be scaled,
so a kernel is started ``kernel_start_allowance_s`` wall seconds earlier than the session model
says (its lead time, scaled) — its start-up is not counted as a cell's delay, as in the
simulator, where kernel start-up is free when the lead covers it.

The session model is the simulator's (`kernelfleet.scheduler.simulator.engine`): a kernel
starts ``session_lead_s`` before the session's first cell, each cell is submitted the trace's
idle gap after the previous one ended (so later cells shift by the delays met), a kernel idle
longer than ``idle_timeout_s + session_lead_s`` is shut down ``idle_timeout_s`` after its cell
and started again before the next, and the session ends ``session_linger_s`` after its last
cell. One deviation: where the scaled gap is too short to shut a kernel down and start it
again with the allowance, the kernel is kept (`CellPlan.reclaim_before` is False); with
per-cell GPU binding an idle kernel holds no GPU, so GPU-hours do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.trace import Trace


@dataclass(frozen=True)
class ReplayTiming:
    """The session model's parameters (trace seconds) and the time scale."""

    time_scale: float = 60.0
    session_lead_s: float = 60.0
    session_linger_s: float = 1800.0
    idle_timeout_s: float = 1800.0
    kernel_start_allowance_s: float = 5.0  # wall seconds

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise InvalidRequest(f"time scale must be > 0, not {self.time_scale}")
        for name in ("session_lead_s", "session_linger_s", "idle_timeout_s"):
            if getattr(self, name) < 0:
                raise InvalidRequest(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.kernel_start_allowance_s < 0:
            raise InvalidRequest("kernel_start_allowance_s must be >= 0")

    def wall(self, trace_seconds: float) -> float:
        """Wall seconds for a span of trace seconds."""
        return trace_seconds / self.time_scale


@dataclass(frozen=True)
class CellPlan:
    """One training event as a cell: GPUs, how long it holds them, and the idle gap before it
    (wall seconds, counted from the end of the session's previous cell; 0 for the first)."""

    line: int
    gpus: int
    duration_s: float
    gap_before_s: float = 0.0
    reclaim_before: bool = False


@dataclass(frozen=True)
class SessionPlan:
    """A session: its kernel's GPU need, when its first cell is due (wall seconds after the
    replay's origin) and its cells in order."""

    id: int
    gpus: int
    first_submit_s: float
    cells: tuple[CellPlan, ...]


def plan_sessions(trace: Trace, timing: ReplayTiming) -> tuple[SessionPlan, ...]:
    """One `SessionPlan` per session of `trace`, in its order. The origin (wall 0) is the
    earliest session start minus the lead time, as the simulator's clock starts."""
    if not trace.sessions:
        return ()
    origin = min(s.start_min for s in trace.sessions) * 60 - timing.session_lead_s
    lead_w = timing.wall(timing.session_lead_s)
    timeout_w = timing.wall(timing.idle_timeout_s)
    plans = []
    for session in trace.sessions:
        cells = []
        previous = None
        for event in session.events:
            gap = 0.0 if previous is None else max(0.0, (event.submit_min - previous) * 60)
            reclaim = (
                timing.idle_timeout_s > 0
                and gap > timing.idle_timeout_s + timing.session_lead_s
                and timing.wall(gap) > timeout_w + lead_w + timing.kernel_start_allowance_s
            )
            cells.append(
                CellPlan(
                    line=event.line,
                    gpus=event.gpus,
                    duration_s=timing.wall(event.duration_min * 60),
                    gap_before_s=timing.wall(gap),
                    reclaim_before=reclaim,
                )
            )
            previous = event.end_min
        first = timing.wall(session.start_min * 60 - origin)
        plans.append(SessionPlan(session.id, session.gpus, first, tuple(cells)))
    return tuple(plans)


def cell_code(duration_s: float) -> str:
    """The cell a training event becomes: it holds the kernel (and its GPUs) for `duration_s`."""
    return f"__import__('time').sleep({duration_s:.6f})"
