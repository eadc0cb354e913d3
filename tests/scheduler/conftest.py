"""Fixtures for the scheduler tests: a small trace file, and the June trace found next to the
checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from .traces import write_trace

REPO = Path(__file__).resolve().parents[2]
JUNE_TRACE = REPO.parent / "shared" / "traces" / "sensei_june_60sec.csv"


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """4 events in 3 sessions of 1, 4 and 8 GPUs, the longest an hour."""
    return write_trace(
        tmp_path / "small.csv",
        "0,1,0,0,a,10,0\n1,1,20,0,a,5,0\n2,4,3,0,b,30,0\n3,8,10,0,c,60,0\n",
    )


@pytest.fixture
def june_trace() -> Path:
    """The published June trace; a missing file fails the test (never skips), saying where."""
    if not JUNE_TRACE.is_file():
        pytest.fail(f"the June trace is missing: looked for {JUNE_TRACE}")
    return JUNE_TRACE
