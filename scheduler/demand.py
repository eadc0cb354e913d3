"""Predicting busy GPUs ahead (issue 17, item 3, a first step): a random forest on the trace's own
history against a moving-average baseline, trained on the first part, scored on the rest.

The series are the trace's, as submitted (no scheduling delay): every ``step_s`` seconds, the
GPUs held by running cells (busy), the GPUs of the cells submitted in the step (arrivals) and the
sessions between their first submit and their last end (active). At step ``t`` the features are
the time of day (as sine and cosine), the change of busy over the last step and its distance from
its mean over the last ``window`` steps, the arrival GPUs over those steps and the change in
active sessions; level-free, so a busier month than the training part is no extrapolation. The
forest predicts the change of busy ``horizon`` steps later. The
baseline predicts the mean busy of the last ``window`` steps. Needs scikit-learn (the ``tools``
extra).

    python -m kernelfleet.scheduler.demand TRACE [--train-days 7]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.trace import Trace, read_trace


@dataclass(frozen=True)
class Series:
    """Per step: busy GPUs (at the step's start), arrival GPUs (in the step), active sessions."""

    step_s: float
    start_s: float
    busy: tuple[float, ...]
    arrivals: tuple[float, ...]
    active: tuple[float, ...]


def series(trace: Trace, step_s: float = 300.0) -> Series:
    """The trace's series at `step_s` resolution, from its first submit to its last end."""
    if step_s <= 0:
        raise InvalidRequest(f"step_s must be > 0, not {step_s}")
    events = [e for s in trace.sessions for e in s.events]
    if not events:
        raise InvalidRequest(f"{trace.path}: no event to build a series from")
    start = min(e.submit_min for e in events) * 60
    end = max(e.end_min for e in events) * 60
    steps = int((end - start) // step_s) + 1
    busy = [0.0] * (steps + 1)  # difference arrays, summed below
    arrivals = [0.0] * steps
    active = [0.0] * (steps + 1)

    def index(seconds: float) -> int:
        return min(steps, math.ceil((seconds - start) / step_s))

    for event in events:
        busy[index(event.submit_min * 60)] += event.gpus
        busy[index(event.end_min * 60)] -= event.gpus
        arrivals[min(steps - 1, int((event.submit_min * 60 - start) // step_s))] += event.gpus
    for session in trace.sessions:
        active[index(session.start_min * 60)] += 1
        active[index(session.end_min * 60)] -= 1
    return Series(step_s, start, _running(busy[:steps]), tuple(arrivals), _running(active[:steps]))


def _running(deltas: list[float]) -> tuple[float, ...]:
    total, out = 0.0, []
    for delta in deltas:
        total += delta
        out.append(total)
    return tuple(out)


def features(data: Series, t: int, window: int) -> list[float]:
    """The features at step `t` (needs ``t >= window``)."""
    seconds_of_day = (data.start_s + t * data.step_s) % 86400
    angle = 2 * math.pi * seconds_of_day / 86400
    recent_busy = data.busy[t - window + 1 : t + 1]
    return [
        math.sin(angle),
        math.cos(angle),
        data.busy[t] - data.busy[t - 1],
        data.busy[t] - sum(recent_busy) / window,
        sum(data.arrivals[t - window + 1 : t + 1]),
        data.active[t] - data.active[t - window],
    ]


@dataclass(frozen=True)
class Evaluation:
    """Mean absolute error of predicted vs actual busy GPUs on the held-back steps."""

    train_steps: int
    test_steps: int
    forest_mae: float
    baseline_mae: float
    mean_busy: float


def evaluate(
    trace: Trace,
    train_days: float = 7.0,
    step_s: float = 300.0,
    horizon: int = 3,
    window: int = 6,
    seed: int = 0,
) -> Evaluation:
    """Train on the steps whose target lies within the first `train_days`, score on the later
    ones: the two sets share no step. `InvalidRequest` when either would be too short."""
    from sklearn.ensemble import RandomForestRegressor

    data = series(trace, step_s)
    split = int(train_days * 86400 // step_s)
    usable = range(window, len(data.busy) - horizon)
    train = [t for t in usable if t + horizon < split]
    test = [t for t in usable if t >= split]
    if len(train) < 10 * window or len(test) < 10:
        raise InvalidRequest(
            f"{trace.path}: too short to train on {train_days:g} days and test on the rest "
            f"({len(train)} training and {len(test)} test steps of {step_s:g} s)"
        )
    forest = RandomForestRegressor(n_estimators=100, min_samples_leaf=5, random_state=seed)
    # the forest learns the change from now: a level never seen in training (the first week is a
    # light one) is then no extrapolation, which trees cannot do
    forest.fit(
        [features(data, t, window) for t in train],
        [data.busy[t + horizon] - data.busy[t] for t in train],
    )
    changes = forest.predict([features(data, t, window) for t in test])
    predicted = [data.busy[t] + change for t, change in zip(test, changes, strict=True)]
    actual = [data.busy[t + horizon] for t in test]
    baseline = [sum(data.busy[t - window + 1 : t + 1]) / window for t in test]
    return Evaluation(
        train_steps=len(train),
        test_steps=len(test),
        forest_mae=sum(abs(p - a) for p, a in zip(predicted, actual, strict=True)) / len(test),
        baseline_mae=sum(abs(b - a) for b, a in zip(baseline, actual, strict=True)) / len(test),
        mean_busy=sum(actual) / len(test),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--train-days", type=float, default=7.0)
    args = parser.parse_args(argv)
    result = evaluate(read_trace(args.trace), train_days=args.train_days)
    print(
        f"busy GPUs 15 min ahead, {result.test_steps} held-back steps of 5 min "
        f"(trained on {result.train_steps}; mean busy {result.mean_busy:.1f} GPUs): "
        f"random forest MAE {result.forest_mae:.2f} GPUs, "
        f"moving average MAE {result.baseline_mae:.2f} GPUs"
    )


if __name__ == "__main__":
    main()
