"""Fixtures for the scheduler tests: the June trace, found next to the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JUNE_TRACE = REPO.parent / "shared" / "traces" / "sensei_june_60sec.csv"
POLICY_FIELDS = frozenset(
    {
        "gpu_hours_provisioned",
        "gpu_hours_committed",
        "start_delay_s",
        "migrations",
        "scale_outs",
        "scale_ins",
        "events",
    }
)
"""The fields of one policy's result in the simulator's JSON before the floor was added: tools
outside the project read them, so their names and meanings never change."""
FLOOR_FIELDS = frozenset(
    {"gpu_hours_busy", "gpu_hours_floor", "gpu_hours_reservation", "saving_share"}
)
"""The fields added with the GPU-hour floor (docs/economics.md)."""
HOST_KIND_FIELDS = frozenset(
    {
        "dollars",
        "dollars_on_demand",
        "gpu_hours_spot",
        "revocations",
        "replacements",
        "replacements_failed",
        "kernels_lost",
        "cells_interrupted",
        "gpu_hours_redone",
    }
)
"""The fields added with host kinds (docs/economics.md, "Transient hosts")."""


@pytest.fixture
def june_trace() -> Path:
    """The published June trace; a missing file fails the test (never skips), saying where."""
    if not JUNE_TRACE.is_file():
        pytest.fail(f"the June trace is missing: looked for {JUNE_TRACE}")
    return JUNE_TRACE
