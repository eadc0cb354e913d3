"""Training a demand model on the first part of a trace and scoring it on the rest (needs
scikit-learn, the ``tools`` extra).

The target at step ``t`` is how far busy rises above ``busy[t]`` at most within the horizon
(``max(busy[t .. t + h]) - busy[t]``, ``h`` steps); a random forest learns it from `FEATURES`.
Steps whose target reaches past the split train; steps from the split on are scored: the two
share no step. The margin is the ``quantile`` of the residuals of a forest fitted on the first
80 % of the training steps and scored on the last 20 %; the shipped forest is then refitted on
all of them. The baseline is the moving average of busy over the window, the same target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from kernelfleet.scheduler.demand import Series, features, series
from kernelfleet.scheduler.demand_model import DemandModel, Tree
from kernelfleet.scheduler.trace import Trace, TraceError


@dataclass(frozen=True)
class Evaluation:
    """Scores on held-back steps, in GPUs: mean absolute error of the forest's prediction (its
    mean, no margin), of the moving average and of "busy now" (persistence); the share of steps
    where the prediction with its margin covered the actual peak; the mean actual peak."""

    steps: int
    forest_mae: float
    baseline_mae: float
    persistence_mae: float
    covered: float
    mean_peak: float


def _target(data: Series, t: int, h: int) -> float:
    return max(data.busy[t : t + h + 1]) - data.busy[t]


def fit_forest(x: list[list[float]], y: list[float], trees: int, seed: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    forest = RandomForestRegressor(
        n_estimators=trees, min_samples_leaf=20, max_depth=12, random_state=seed, n_jobs=1
    )
    return forest.fit(x, y)


def export_trees(forest: Any) -> tuple[Tree, ...]:
    out = []
    for estimator in forest.estimators_:
        tree = estimator.tree_
        out.append(
            Tree(
                left=tuple(int(v) for v in tree.children_left),
                right=tuple(int(v) for v in tree.children_right),
                feature=tuple(int(v) if v >= 0 else -2 for v in tree.feature),
                threshold=tuple(float(v) for v in tree.threshold),
                value=tuple(float(v) for v in tree.value[:, 0, 0]),
            )
        )
    return tuple(out)


def split_step(data: Series, until_min: float) -> int:
    """The first step at or after trace minute `until_min`."""
    return max(0, math.ceil((until_min * 60 - data.start_s) / data.step_s))


def train(
    trace: Trace,
    *,
    until_min: float | None = None,
    first_days: float = 7.0,
    step_s: float = 60.0,
    window: int = 10,
    horizon_s: float = 120.0,
    quantile: float = 0.9,
    gpus_per_host: int = 8,
    trees: int = 40,
    seed: int = 0,
) -> tuple[DemandModel, Evaluation | None]:
    """A model trained on the steps before `until_min` (trace minutes; default: the first
    `first_days` after the first submit), and its scores on the steps from there (None when
    the trace has fewer than 10 of them). `TraceError` when too short to train on."""
    if not 0 <= quantile < 1:
        raise TraceError(f"quantile must be in [0, 1), not {quantile}")
    if not horizon_s > 0 or gpus_per_host < 1 or trees < 1 or window < 1:
        raise TraceError(
            f"horizon_s ({horizon_s}) must be > 0; gpus_per_host ({gpus_per_host}), trees "
            f"({trees}) and window ({window}) >= 1"
        )
    data = series(trace, step_s)
    h = max(1, math.ceil(round(horizon_s / step_s, 9)))
    if until_min is None:
        until_min = data.start_s / 60 + first_days * 1440
    split = split_step(data, until_min)
    chosen = [t for t in range(window, len(data.busy) - h) if t + h < split]
    if len(chosen) < 100:
        raise TraceError(
            f"{trace.path}: too short to train on: {len(chosen)} steps of {step_s:g} s before "
            f"minute {until_min:g} (at least 100 needed, with a window of {window} and a "
            f"horizon of {h} step(s))"
        )
    x = [features(data, t, window) for t in chosen]
    y = [_target(data, t, h) for t in chosen]
    fit = int(len(chosen) * 0.8)
    first = fit_forest(x[:fit], y[:fit], trees, seed)
    residuals = sorted(a - p for a, p in zip(y[fit:], first.predict(x[fit:]), strict=True))
    margin = max(0.0, residuals[min(len(residuals) - 1, int(quantile * len(residuals)))])
    forest = fit_forest(x, y, trees, seed)
    model = DemandModel(
        step_s=step_s,
        window=window,
        horizon_s=horizon_s,
        gpus_per_host=gpus_per_host,
        quantile=quantile,
        margin_gpus=margin,
        trees=export_trees(forest),
        trained={
            "trace": str(trace.path),
            "from_s": data.start_s + chosen[0] * step_s,
            "until_s": data.start_s + split * step_s,
            "steps": len(chosen),
            "held_out_for_margin": len(chosen) - fit,
        },
        quality={},
    )
    evaluation = evaluate(model, data, split)
    if evaluation is not None:
        model = replace(model, quality=asdict(evaluation))
    return model, evaluation


def evaluate(model: DemandModel, data: Series, split: int) -> Evaluation | None:
    """`model`'s scores on the steps of `data` from `split` on (None if fewer than 10)."""
    window, h = model.window, model.horizon_steps
    test = [t for t in range(max(split, window), len(data.busy) - h)]
    if len(test) < 10:
        return None
    forest_error = baseline_error = persistence_error = peaks = 0.0
    covered = 0
    for t in test:
        x = features(data, t, window)
        peak = data.busy[t] + _target(data, t, h)
        rise = float(model.rise(x))
        forest_error += abs(data.busy[t] + rise - peak)
        baseline_error += abs(sum(data.busy[t - window + 1 : t + 1]) / window - peak)
        persistence_error += abs(data.busy[t] - peak)
        covered += int(peak <= data.busy[t] + rise + model.margin_gpus)
        peaks += peak
    n = len(test)
    return Evaluation(
        steps=n,
        forest_mae=forest_error / n,
        baseline_mae=baseline_error / n,
        persistence_mae=persistence_error / n,
        covered=covered / n,
        mean_peak=peaks / n,
    )
