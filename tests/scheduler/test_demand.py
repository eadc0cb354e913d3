"""The demand predictor's series by hand, its refusal of a short trace, and a forest that learns
a daily cycle the moving average can only follow."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.demand import evaluate, series

from .test_simulator import trace


def test_series_by_hand() -> None:
    # a 2-GPU cell from minute 0 to 10 and a 4-GPU cell from minute 5 to 15 (another session),
    # in 5-minute steps: busy 2, 6, 4 at the steps' starts; arrivals 2 then 4; both sessions
    # active from their first submit to their end
    data = series(trace((2, 0, 10), (4, 5, 10)), step_s=300)
    assert data.busy == (2.0, 6.0, 4.0, 0.0)
    assert data.arrivals == (2.0, 4.0, 0.0, 0.0)
    assert data.active == (1.0, 2.0, 1.0, 0.0)


def test_a_trace_too_short_to_train_on_says_so() -> None:
    with pytest.raises(InvalidRequest, match="too short to train on 7 days"):
        evaluate(trace((1, 0, 60)))
    with pytest.raises(InvalidRequest, match="step_s must be > 0"):
        series(trace((1, 0, 60)), step_s=0)


def test_the_forest_beats_the_moving_average_on_a_daily_cycle() -> None:
    # 14 days; every day at 09:00 eight 8-GPU cells start together and run 3 h: busy jumps
    # 0 -> 64 at 09:00 and back at 12:00, which a 30-minute average learns only afterwards
    events = [(8, day * 1440 + 540 + 0.001 * k, 180) for day in range(14) for k in range(8)]
    result = evaluate(trace(*events), train_days=7)
    assert result.test_steps > 1500
    assert result.forest_mae < 0.5 * result.baseline_mae
