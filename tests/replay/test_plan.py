"""The replay schedule on small literal traces, with hand-checked answers."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.replay.driver import busy_gauge
from kernelfleet.replay.plan import CellPlan, ReplayTiming, cell_code, plan_sessions
from kernelfleet.scheduler.trace import Trace, TraceEvent, recover_sessions


def trace(*events: tuple[int, float, float]) -> Trace:
    """Events as (gpus, submit minute, duration minutes), in file order."""
    parsed = tuple(
        TraceEvent(line=i + 2, job_id=str(i), gpus=g, submit_min=s, duration_min=d)
        for i, (g, s, d) in enumerate(events)
    )
    return Trace("literal", parsed, recover_sessions(parsed))


# session 0: cells at minutes 0-10, 20-30, 100-105; session 1 (4 GPUs) starts at minute 5
TWO_SESSIONS = trace((1, 0, 10), (1, 20, 10), (1, 100, 5), (4, 5, 1))


def test_a_trace_minute_per_wall_second() -> None:
    timing = ReplayTiming(
        time_scale=60, session_lead_s=60, idle_timeout_s=1800, kernel_start_allowance_s=1.0
    )
    first, second = plan_sessions(TWO_SESSIONS, timing)
    # the origin is minute 0 minus the 60 s lead: session 0's first cell is due 1 s after it
    assert (first.gpus, first.first_submit_s) == (1, 1.0)
    assert first.cells == (
        CellPlan(line=2, gpus=1, duration_s=10.0, gap_before_s=0.0, reclaim_before=False),
        # 10 trace minutes idle: under the 30 min timeout, the kernel stays
        CellPlan(line=3, gpus=1, duration_s=10.0, gap_before_s=10.0, reclaim_before=False),
        # 70 minutes idle > 30 min timeout + 1 min lead, and 70 s > 30 + 1 + 1 s allowance
        CellPlan(line=4, gpus=1, duration_s=5.0, gap_before_s=70.0, reclaim_before=True),
    )
    assert (second.gpus, second.first_submit_s) == (4, 6.0)
    assert second.cells == (CellPlan(line=5, gpus=4, duration_s=1.0),)


def test_a_gap_too_short_to_restart_a_kernel_keeps_it() -> None:
    # 70 s of wall gap cannot hold 30 s timeout + 1 s lead + 40 s to start a kernel again
    timing = ReplayTiming(time_scale=60, kernel_start_allowance_s=40)
    cells = plan_sessions(TWO_SESSIONS, timing)[0].cells
    assert [cell.reclaim_before for cell in cells] == [False, False, False]


def test_no_idle_timeout_never_reclaims() -> None:
    timing = ReplayTiming(time_scale=600, idle_timeout_s=0)
    assert not any(c.reclaim_before for p in plan_sessions(TWO_SESSIONS, timing) for c in p.cells)
    assert plan_sessions(TWO_SESSIONS, timing)[0].cells[0].duration_s == 1.0


def test_impossible_timings_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="time scale must be > 0"):
        ReplayTiming(time_scale=0)
    with pytest.raises(InvalidRequest, match="session_linger_s must be >= 0"):
        ReplayTiming(session_linger_s=-1)


def test_cell_code_sleeps_for_the_duration() -> None:
    namespace: dict = {}
    exec(cell_code(0.0), namespace)  # runs, and returns at once
    assert cell_code(1.5) == "__import__('time').sleep(1.500000)"


def test_busy_gauge_integrates_overlapping_cells() -> None:
    # 1 GPU over [0, 3600), 8 GPUs over [1800, 5400): 1 + 8 * 1 = 9 GPU-hours
    gauge = busy_gauge([(0.0, 3600.0, 1), (1800.0, 5400.0, 8)])
    assert gauge.area / 3600 == pytest.approx(9.0)
    assert max(value for _, value in gauge.history) == 9
    assert gauge.history[-1] == (5400.0, 0)
