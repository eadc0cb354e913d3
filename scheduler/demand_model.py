"""The demand model file: a random forest's trees as plain JSON arrays, with what it was trained
for, read back without unpickling anything (an operator may have been handed the file).

A model predicts, at the start of a step, how far the busy GPUs will rise above their value now
at most within the next ``horizon_s`` seconds (the provisioning lead time); `predicted_gpus` adds
that to the busy GPUs now and the ``margin_gpus`` that covered the ``quantile`` of the held-out
residuals when it was trained. `load_model` checks every field and refuses, naming it, a file
for other features, another step or window, or another host size (``gpus_per_host``): its
predictions would be in the wrong units. `Forecaster` joins a model to a live `DemandHistory`.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.demand import FEATURES, DemandHistory

FORMAT = "kernelfleet-demand-forest"
VERSION = 1


class DemandModelError(InvalidRequest):
    """A demand model file that cannot be used: missing, unreadable, malformed, or made for
    another cluster shape or other features. The message names the file and the field."""


@dataclass(frozen=True)
class Tree:
    """One regression tree in scikit-learn's array layout: node ``i`` is a leaf when
    ``left[i] == -1``, else it goes left when ``x[feature[i]] <= threshold[i]``."""

    left: tuple[int, ...]
    right: tuple[int, ...]
    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    value: tuple[float, ...]

    def predict(self, x: list[float]) -> float:
        left, right, feature, threshold = self.left, self.right, self.feature, self.threshold
        node = 0
        while left[node] >= 0:
            node = left[node] if x[feature[node]] <= threshold[node] else right[node]
        return self.value[node]


@dataclass(frozen=True)
class DemandModel:
    """A trained demand model; see the module docstring. ``trained`` describes the training
    span (trace, first and last step's clock seconds, steps) and ``quality`` the held-back
    scores the trainer measured (informative only)."""

    step_s: float
    window: int
    horizon_s: float
    gpus_per_host: int
    quantile: float
    margin_gpus: float
    trees: tuple[Tree, ...]
    trained: dict[str, Any]
    quality: dict[str, Any]
    features: tuple[str, ...] = FEATURES

    @property
    def horizon_steps(self) -> int:
        return max(1, math.ceil(round(self.horizon_s / self.step_s, 9)))

    def rise(self, x: list[float]) -> float:
        """The forest's mean prediction: the most the busy GPUs rise within the horizon."""
        return sum(tree.predict(x) for tree in self.trees) / len(self.trees)

    def predicted_gpus(self, busy_now: float, x: list[float]) -> float:
        """Busy GPUs to provision for within the horizon, margin included (never below 0)."""
        return max(0.0, busy_now + self.rise(x) + self.margin_gpus)

    def document(self) -> dict[str, Any]:
        """The JSON document `save` writes."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "features": list(self.features),
            "step_s": self.step_s,
            "window_steps": self.window,
            "horizon_s": self.horizon_s,
            "gpus_per_host": self.gpus_per_host,
            "quantile": self.quantile,
            "margin_gpus": self.margin_gpus,
            "trained": self.trained,
            "quality": self.quality,
            "trees": [asdict(tree) for tree in self.trees],
        }

    def save(self, path: str | Path) -> None:
        """Write the model as JSON (``.json``); other suffixes are refused."""
        target = Path(path)
        if target.suffix != ".json":
            raise DemandModelError(
                f"{target}: a demand model is written as JSON (.json); skops is not a "
                "dependency of kernelfleet"
            )
        target.write_text(json.dumps(self.document()) + "\n", encoding="utf-8")


def load_model(path: str | Path, gpus_per_host: int | None = None) -> DemandModel:
    """The model in `path`, every field checked; `DemandModelError` naming the file and the
    field otherwise, and when `gpus_per_host` is given and is not the model's."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DemandModelError(f"{source}: no such demand model file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DemandModelError(f"{source}: cannot read the demand model: {e}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise DemandModelError(f"{source}: not a JSON demand model ({e})") from None
    model = _parse(source, document)
    if gpus_per_host is not None and model.gpus_per_host != gpus_per_host:
        raise DemandModelError(
            f"{source}: trained for hosts of {model.gpus_per_host} GPU(s) (gpus_per_host), "
            f"this fleet adds hosts of {gpus_per_host}"
        )
    return model


def load_or_warn(path: str | Path, gpus_per_host: int, log: logging.Logger) -> DemandModel | None:
    """`load_model`, or None with a warning naming why the autoscaler stays reactive."""
    try:
        model = load_model(path, gpus_per_host)
    except DemandModelError as e:
        log.warning("demand model not used, autoscaling follows the reactive rule: %s", e.message)
        return None
    log.info(
        "demand model %s: busy GPUs %g s ahead, %d trees, margin %.1f GPUs (quantile %g)",
        path,
        model.horizon_s,
        len(model.trees),
        model.margin_gpus,
        model.quantile,
    )
    return model


def _parse(source: Path, document: Any) -> DemandModel:
    def fail(field: str, why: str) -> DemandModelError:
        return DemandModelError(f"{source}: {field} {why}")

    if not isinstance(document, dict):
        raise fail("the document", "must be a JSON object")
    if document.get("format") != FORMAT:
        raise fail("format", f"must be {FORMAT!r}, not {document.get('format')!r}")
    if document.get("version") != VERSION:
        raise fail("version", f"must be {VERSION}, not {document.get('version')!r}")
    if document.get("features") != list(FEATURES):
        raise fail("features", f"must be {list(FEATURES)} (this kernelfleet computes those)")

    def number(field: str, low: float, *, integer: bool = False, above: bool = False) -> Any:
        value = document.get(field)
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
            raise fail(field, f"must be a finite {'integer' if integer else 'number'}")
        if value < low or (above and value == low):
            raise fail(field, f"must be {'>' if above else '>='} {low}, not {value}")
        return value

    step_s = float(number("step_s", 0, above=True))
    window = number("window_steps", 1, integer=True)
    horizon_s = float(number("horizon_s", 0, above=True))
    gpus_per_host = number("gpus_per_host", 1, integer=True)
    quantile = float(number("quantile", 0))
    if quantile >= 1:
        raise fail("quantile", f"must be below 1, not {quantile}")
    margin = float(number("margin_gpus", 0))
    for field in ("trained", "quality"):
        if not isinstance(document.get(field), dict):
            raise fail(field, "must be a JSON object")
    trees = document.get("trees")
    if not isinstance(trees, list) or not trees:
        raise fail("trees", "must be a non-empty list")
    parsed = tuple(_tree(fail, i, tree) for i, tree in enumerate(trees))
    return DemandModel(
        step_s=step_s,
        window=window,
        horizon_s=horizon_s,
        gpus_per_host=gpus_per_host,
        quantile=quantile,
        margin_gpus=margin,
        trees=parsed,
        trained=document["trained"],
        quality=document["quality"],
    )


def _tree(fail: Any, index: int, tree: Any) -> Tree:
    """One tree, checked so that `Tree.predict` ends at a leaf for any input: children come
    after their parent (no cycle) and within the arrays, and split features exist."""
    name = f"trees[{index}]"
    if not isinstance(tree, dict):
        raise fail(name, "must be a JSON object")
    arrays = {}
    for key in ("left", "right", "feature", "threshold", "value"):
        values = tree.get(key)
        if not isinstance(values, list) or not values:
            raise fail(f"{name}.{key}", "must be a non-empty list")
        arrays[key] = values
    size = len(arrays["left"])
    if any(len(values) != size for values in arrays.values()):
        raise fail(name, "has arrays of different lengths")
    for key in ("left", "right", "feature"):
        if any(isinstance(v, bool) or not isinstance(v, int) for v in arrays[key]):
            raise fail(f"{name}.{key}", "must hold integers")
    for key in ("threshold", "value"):
        if any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            for v in arrays[key]
        ):
            raise fail(f"{name}.{key}", "must hold finite numbers")
    for node, (left, right, feature) in enumerate(
        zip(arrays["left"], arrays["right"], arrays["feature"], strict=True)
    ):
        if left < 0 and right < 0:
            continue
        if not (node < left < size and node < right < size):
            raise fail(f"{name} node {node}", f"has children {left} and {right} out of order")
        if not 0 <= feature < len(FEATURES):
            raise fail(f"{name} node {node}", f"splits on feature {feature}, which is unknown")
    return Tree(
        left=tuple(arrays["left"]),
        right=tuple(arrays["right"]),
        feature=tuple(arrays["feature"]),
        threshold=tuple(float(v) for v in arrays["threshold"]),
        value=tuple(float(v) for v in arrays["value"]),
    )


class Forecaster:
    """A model fed live: the caller reports arrivals, ends and observations as `DemandHistory`
    asks, and reads `predicted_gpus`, computed once a step (None until the history holds a
    window)."""

    def __init__(self, model: DemandModel) -> None:
        self.model = model
        self.history = DemandHistory(model.step_s, model.window)
        self._cached: tuple[int | None, float | None] = (None, None)

    def arrival(self, now: float, gpus: float) -> None:
        self.history.arrival(now, gpus)

    def end(self, now: float, gpus: float) -> None:
        self.history.end(now, gpus)

    def observe(self, now: float, busy: float, active: float) -> None:
        self.history.observe(now, busy, active)

    def predicted_gpus(self) -> float | None:
        """Busy GPUs to provision for at the latest step, margin included; None until known."""
        step = self.history.step
        if self._cached[0] == step and step is not None:
            return self._cached[1]
        x = self.history.features()
        start = self.history.busy_at_start
        value = None if x is None or start is None else self.model.predicted_gpus(start, x)
        if x is not None:
            self._cached = (step, value)
        return value
