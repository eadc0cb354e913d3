"""The demand predictor: its series by hand, the same features online as from a whole trace, a
forest that learns a daily cycle the moving average can only follow, the model file (round trip,
bad files refused with the field named), a trace too short to train on, and the autoscaling
rule adding a host before the demand it predicts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.autoscale import AutoscaleConfig, autoscale
from kernelfleet.scheduler.decisions import Hold, ScaleOut
from kernelfleet.scheduler.demand import FEATURES, DemandHistory, features, series
from kernelfleet.scheduler.demand_model import (
    DemandModelError,
    Forecaster,
    load_model,
)
from kernelfleet.scheduler.demand_train import export_trees, fit_forest, train
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot
from kernelfleet.scheduler.trace import Trace, TraceError

from .traces import trace

pytest.importorskip("sklearn")


def daily_bursts(days: int) -> Trace:
    """Every day at 09:00 eight 8-GPU cells start together and run 3 h: busy jumps 0 -> 64 at
    09:00 and back at 12:00; nothing else happens."""
    return trace(*((8, d * 1440 + 540 + 0.001 * k, 180) for d in range(days) for k in range(8)))


@pytest.fixture(scope="module")
def bursts_model() -> tuple:
    return train(daily_bursts(9), first_days=7, horizon_s=600, trees=10)


def test_series_by_hand() -> None:
    # a 2-GPU cell from minute 0 to 10 and a 4-GPU cell from minute 5 to 15 (another session),
    # in 5-minute steps: busy 2, 6, 4 at the steps' starts; arrivals 2 then 4; ends (the step
    # a cell ended in) 2 then 4; both sessions active from their first submit to their end
    data = series(trace((2, 0, 10), (4, 5, 10)), step_s=300)
    assert data.busy == (2.0, 6.0, 4.0, 0.0)
    assert data.arrivals == (2.0, 4.0, 0.0, 0.0)
    assert data.ends == (0.0, 0.0, 2.0, 4.0)
    assert data.active == (1.0, 2.0, 1.0, 0.0)
    with pytest.raises(InvalidRequest, match="step_s must be > 0"):
        series(trace((1, 0, 60)), step_s=0)


def test_the_history_online_gives_the_features_of_the_whole_series() -> None:
    # the trace replayed as events on the clock (submits, ends, an observation at every step
    # start) gives, at each step, the features computed from the whole series
    events = [(2, 0, 10), (4, 5, 10), (1, 7, 3), (8, 12, 20), (2, 31, 4)]
    data = series(trace(*events), step_s=60)
    history = DemandHistory(60, window=3)
    timeline = sorted(
        [(s * 60, 1, g) for g, s, _ in events] + [((s + d) * 60, 0, g) for g, s, d in events]
    )
    for t in range(len(data.busy)):
        history.observe(t * 60, data.busy[t], data.active[t])
        if t >= 3:
            assert history.features() == pytest.approx(features(data, t, 3)), t
        else:
            assert history.features() is None
        for at, kind, gpus in [e for e in timeline if t * 60 <= e[0] < (t + 1) * 60]:
            (history.arrival if kind else history.end)(at, gpus)


def test_a_gap_in_observations_repeats_the_last_values() -> None:
    history = DemandHistory(60, window=2)
    history.observe(0, 5, 1)
    history.observe(200, 7, 1)  # steps 1 and 2 unobserved: they keep busy 5, then step 3 is 7
    assert history.features() == pytest.approx(
        [*features_time(180), 7 - 5, 7 - (5 + 7) / 2, 0, 0, 0]
    )


def features_time(clock_s: float) -> list[float]:
    import math

    angle = 2 * math.pi * clock_s / 86400
    return [math.sin(angle), math.cos(angle)]


def test_a_trace_too_short_to_train_on_says_so() -> None:
    with pytest.raises(TraceError, match="too short to train on: 49 steps"):
        train(trace((1, 0, 60)))
    with pytest.raises(TraceError, match="quantile must be in"):
        train(daily_bursts(2), quantile=1.0)


def test_the_forest_beats_the_moving_average_on_a_daily_cycle(bursts_model: tuple) -> None:
    model, scores = bursts_model
    assert scores.steps > 1500  # the day and a half after the training week
    assert scores.forest_mae < 0.5 * scores.baseline_mae
    assert scores.forest_mae < 0.5 * scores.persistence_mae
    assert model.trained["until_s"] == 540 * 60 + 7 * 86400  # 7 days after the first submit


def test_the_model_file_round_trips_and_predicts_as_the_forest(tmp_path: Path) -> None:
    data = series(daily_bursts(3), step_s=60)
    x = [features(data, t, 10) for t in range(10, len(data.busy))]
    y = [data.busy[t] for t in range(10, len(data.busy))]
    forest = fit_forest(x, y, trees=5, seed=1)
    model, _ = train(daily_bursts(3), first_days=2, trees=5)
    model = replace(model, trees=export_trees(forest))
    model.save(tmp_path / "m.json")
    loaded = load_model(tmp_path / "m.json", gpus_per_host=8)
    assert loaded == model
    assert [loaded.rise(v) for v in x] == pytest.approx(list(forest.predict(x)))
    assert json.loads((tmp_path / "m.json").read_text())["features"] == list(FEATURES)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_bad_model_files_are_refused_with_the_reason(tmp_path: Path, bursts_model: tuple) -> None:
    model, _ = bursts_model
    model.save(tmp_path / "good.json")
    good = json.loads((tmp_path / "good.json").read_text())
    with pytest.raises(DemandModelError, match="no such demand model file"):
        load_model(tmp_path / "missing.json")
    with pytest.raises(DemandModelError, match="not a JSON demand model"):
        load_model(write(tmp_path / "cut.json", (tmp_path / "good.json").read_text()[:500]))
    with pytest.raises(DemandModelError, match=r"trained for hosts of 8 GPU.*adds hosts of 4"):
        load_model(tmp_path / "good.json", gpus_per_host=4)
    cycle = json.loads(json.dumps(good))
    cycle["trees"][0]["left"][0] = 0  # a node its own child: a prediction would never end
    with pytest.raises(DemandModelError, match=r"trees\[0\] node 0 has children 0"):
        load_model(write(tmp_path / "cycle.json", json.dumps(cycle)))
    for field, value, why in [
        ("format", "pickle", "format must be 'kernelfleet-demand-forest'"),
        ("features", ["hour"], "features must be"),
        ("step_s", 0, "step_s must be > 0"),
        ("quantile", 1.5, "quantile must be below 1"),
        ("margin_gpus", float("nan"), "margin_gpus must be a finite number"),
        ("trees", [], "trees must be a non-empty list"),
    ]:
        bad = {**good, field: value}
        with pytest.raises(DemandModelError, match=why):
            load_model(write(tmp_path / f"{field}.json", json.dumps(bad)))
    with pytest.raises(DemandModelError, match="written as JSON"):
        model.save(tmp_path / "model.skops")


def test_the_rule_adds_a_host_before_the_predicted_burst(bursts_model: tuple) -> None:
    # day 8 of the bursts, fed online: at 08:55 nothing runs, yet the model expects 64 busy
    # GPUs within 10 minutes, so the rule asks for 8 hosts of 8 GPUs; without it, it holds
    model, _ = bursts_model
    data = series(daily_bursts(9), step_s=60)
    forecaster = Forecaster(model)
    day8 = int((7 * 86400 - data.start_s) // 60)
    for t in range(day8, day8 + 535):  # up to 08:55
        forecaster.observe(data.start_s + t * 60, data.busy[t], data.active[t])
    predicted = forecaster.predicted_gpus()
    assert predicted is not None
    assert predicted >= 56
    config = AutoscaleConfig(headroom=1.0, buffer_hosts=0, min_hosts=1)
    idle = FleetSnapshot((HostSnapshot("h1", 8),), gpus_per_host=8)
    assert autoscale(idle, config) == Hold()
    decision = autoscale(
        FleetSnapshot(idle.hosts, gpus_per_host=8, predicted_gpus=predicted), config
    )
    assert isinstance(decision, ScaleOut)
    assert decision.hosts >= 6
    # at 04:00 the model expects nothing: the rule holds
    quiet = Forecaster(model)
    for t in range(day8, day8 + 240):
        quiet.observe(data.start_s + t * 60, data.busy[t], data.active[t])
    calm = quiet.predicted_gpus()
    assert calm is not None
    assert calm < 8
    assert (
        autoscale(FleetSnapshot(idle.hosts, gpus_per_host=8, predicted_gpus=calm), config) == Hold()
    )
