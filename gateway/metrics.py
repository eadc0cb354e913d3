"""Prometheus metrics without a dependency: counters, gauges and fixed-bucket histograms, with
labels, rendered in the text exposition format 0.0.4.

`MetricsRegistry` holds the metrics and renders them (``GET /metrics`` serves `render()`);
`FleetMetrics` defines the gateway's own (issue 4 §6), named ``kernelfleet_<noun>_<unit>``.
Everything runs on the gateway's event loop, so nothing here locks. Label values are created
with ``labels(...)``; create the expected ones up front so that they are exported as 0 before
the first event.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Sample = tuple[str, tuple[tuple[str, str], ...], float]
"""(name suffix, label pairs, value)."""


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``+Inf``, ``-Inf``, ``NaN`` or a Python float."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Child:
    def samples(self, pairs: tuple[tuple[str, str], ...]) -> Iterator[Sample]:
        raise NotImplementedError


ChildT = TypeVar("ChildT", bound=_Child)


class _Metric(Generic[ChildT]):
    """A metric family: one child per combination of label values."""

    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} for {name}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate label names for {name}: {labels}")
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._children: dict[tuple[str, ...], ChildT] = {}
        if not self.label_names:
            self._children[()] = self._new_child()

    def labels(self, *values: str, **named: str) -> ChildT:
        """The child for these label values (positional in declaration order, or by name)."""
        if named:
            if values or set(named) != set(self.label_names):
                raise ValueError(f"{self.name} takes labels {self.label_names}, got {named}")
            values = tuple(named[label] for label in self.label_names)
        if len(values) != len(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {values}")
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def _unlabelled(self) -> ChildT:
        if self.label_names:
            raise ValueError(f"{self.name} has labels {self.label_names}: use labels(...)")
        return self._children[()]

    def _new_child(self) -> ChildT:
        raise NotImplementedError

    def samples(self) -> Iterator[Sample]:
        for key in sorted(self._children):
            pairs = tuple(zip(self.label_names, key, strict=True))
            yield from self._children[key].samples(pairs)


class _Value(_Child):
    def __init__(self, monotonic: bool) -> None:
        self.value = 0.0
        self._monotonic = monotonic

    def inc(self, amount: float = 1.0) -> None:
        if self._monotonic and amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        if self._monotonic:
            raise ValueError("a counter only goes up")
        self.value -= amount

    def set(self, value: float) -> None:
        if self._monotonic:
            raise ValueError("a counter cannot be set")
        self.value = float(value)

    def samples(self, pairs: tuple[tuple[str, str], ...]) -> Iterator[Sample]:
        yield "", pairs, self.value


class Counter(_Metric[_Value]):
    """A count that only goes up. Its name must end in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {name!r}")
        super().__init__(name, help, labels)

    def _new_child(self) -> _Value:
        return _Value(monotonic=True)

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    @property
    def value(self) -> float:
        return self._unlabelled().value


class Gauge(_Metric[_Value]):
    """A value that goes up and down."""

    kind = "gauge"

    def _new_child(self) -> _Value:
        return _Value(monotonic=False)

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)

    @property
    def value(self) -> float:
        return self._unlabelled().value


class _Buckets(_Child):
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def samples(self, pairs: tuple[tuple[str, str], ...]) -> Iterator[Sample]:
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            yield "_bucket", (*pairs, ("le", format_value(bound))), float(cumulative)
        yield "_sum", pairs, self.sum
        yield "_count", pairs, float(self.count)


class Histogram(_Metric[_Buckets]):
    """Observations counted in fixed buckets (upper bounds; ``+Inf`` is added)."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, buckets: Iterable[float], labels: Sequence[str] = ()
    ) -> None:
        bounds = sorted(float(bound) for bound in buckets)
        if not bounds or len(set(bounds)) != len(bounds) or any(map(math.isnan, bounds)):
            raise ValueError(f"{name} needs distinct, ordered bucket bounds")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        if "le" in labels:
            raise ValueError(f"{name}: 'le' is reserved for histogram buckets")
        self.buckets = tuple(bounds)
        super().__init__(name, help, labels)

    def _new_child(self) -> _Buckets:
        return _Buckets(self.buckets)

    def observe(self, value: float) -> None:
        self._unlabelled().observe(value)


class MetricsRegistry:
    """Metrics by name, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric[Any]] = {}
        self._collectors: list[Callable[[], None]] = []

    def register(self, metric: _Metric[Any]) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"a metric named {metric.name} is registered already")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, labels)
        self.register(metric)
        return metric

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, labels)
        self.register(metric)
        return metric

    def histogram(
        self, name: str, help: str, buckets: Iterable[float], labels: Sequence[str] = ()
    ) -> Histogram:
        metric = Histogram(name, help, buckets, labels)
        self.register(metric)
        return metric

    def on_collect(self, callback: Callable[[], None]) -> None:
        """Call `callback` before every `render` (to set gauges read from live state)."""
        self._collectors.append(callback)

    def render(self) -> str:
        """Every metric in the text exposition format 0.0.4, ending with a newline."""
        for callback in self._collectors:
            callback()
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.append(f"# HELP {metric.name} {escape_help(metric.help)}")
            lines.append(f"# TYPE {metric.name} {metric.kind}")
            for suffix, pairs, value in metric.samples():
                labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)
                braces = f"{{{labels}}}" if labels else ""
                lines.append(f"{metric.name}{suffix}{braces} {format_value(value)}")
        return "\n".join(lines) + "\n"


CELL_START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
KERNEL_START_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
MIGRATION_OUTCOMES = ("succeeded", "failed")


class FleetMetrics:
    """The gateway's metrics (issue 4 §6), on their own registry.

    Who updates what: the GPU gauges from the ledger and the moving window (on collect, say);
    ``cell_start_delay`` per cell, from execute_request received to execution started;
    ``queued_cells`` when a cell starts or stops waiting; ``migrations`` per replica moved;
    ``hosts_added``/``hosts_removed`` per host the autoscaler started/stopped;
    ``kernel_start`` per kernel, from the create request to the kernel answering;
    ``migration_time`` per replica moved, from asking to the new replica caught up and the old
    one gone; ``scale_out_time`` per host the autoscaler started, until its agent listens;
    ``ledger_breaches`` per breach a checked `GpuLedger` finds.
    """

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.total_gpus = r.gauge("kernelfleet_total_gpus", "GPUs on alive hosts.")
        self.committed_gpus = r.gauge(
            "kernelfleet_committed_gpus", "GPUs bound to running cells now."
        )
        self.busy_gpus = r.gauge(
            "kernelfleet_busy_gpus", "GPUs committed to running cells, averaged over the window."
        )
        self.demand_gpus = r.gauge(
            "kernelfleet_demand_gpus", "GPUs subscribed by replicas, averaged over the window."
        )
        self.subscription_ratio = r.gauge(
            "kernelfleet_subscription_ratio",
            "Cluster subscription ratio: demand GPUs / busy GPUs, within [1, 7].",
        )
        self.cell_start_delay = r.histogram(
            "kernelfleet_cell_start_delay_seconds",
            "Time from a cell's execute_request reaching the gateway to its execution starting.",
            CELL_START_BUCKETS,
        )
        self.queued_cells = r.gauge(
            "kernelfleet_queued_cells", "Cells waiting for GPUs or hosts (queue length)."
        )
        self.migrations = r.counter(
            "kernelfleet_migrations_total", "Replicas moved to another host.", ["outcome"]
        )
        for outcome in MIGRATION_OUTCOMES:
            self.migrations.labels(outcome)
        self.hosts_added = r.counter(
            "kernelfleet_scale_out_hosts_total", "Hosts the autoscaler started (scale-outs)."
        )
        self.hosts_removed = r.counter(
            "kernelfleet_scale_in_hosts_total", "Hosts the autoscaler stopped (scale-ins)."
        )
        self.ledger_breaches = r.counter(
            "kernelfleet_ledger_breaches_total",
            "GPU ledger invariant breaches found, each once (only with GatewayApp.check_ledger).",
        )
        self.kernel_start = r.histogram(
            "kernelfleet_kernel_start_seconds",
            "Time from a kernel-create request to the kernel answering.",
            KERNEL_START_BUCKETS,
        )
        self.migration_time = r.histogram(
            "kernelfleet_migration_seconds",
            "Time to move a replica: the new one started and caught up, the old one stopped.",
            KERNEL_START_BUCKETS,
        )
        self.scale_out_time = r.histogram(
            "kernelfleet_scale_out_seconds",
            "Time for the autoscaler to start a host, until its agent listens.",
            KERNEL_START_BUCKETS,
        )

    def render(self) -> str:
        return self.registry.render()
