"""The gateway's Prometheus metrics, on `prometheus_client`.

`FleetMetrics` defines the gateway's own metrics (issue 4 §6), named ``kernelfleet_<noun>_<unit>``,
on a private `MetricsRegistry` (never prometheus_client's global ``REGISTRY``: a test process runs
several gateways, and each must count alone). ``GET /metrics`` serves the registry through
``prometheus_client.generate_latest`` (see `kernelfleet.gateway.handlers.metrics`).

The exposition is the one the gateway served before it used prometheus_client: the same families,
types, HELP texts and label sets, and no ``<name>_created`` series (prometheus_client adds them to
counters and histograms; `MetricsRegistry.collect` leaves them out). Label values are created up
front so that they are exported as 0 before the first event. Read a value back with
``metrics.registry.get_sample_value(name, labels)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

__all__ = [
    "CELL_START_BUCKETS",
    "HOST_REPORT_BUCKETS",
    "KERNEL_START_BUCKETS",
    "LOOP_LAG_BUCKETS",
    "MIGRATION_OUTCOMES",
    "START_SOURCES",
    "FleetMetrics",
    "MetricsRegistry",
]


class MetricsRegistry(CollectorRegistry):
    """A `CollectorRegistry` that runs callbacks before each collection and exports no
    ``_created`` series.

    `on_collect` callbacks run, in the order given, at the start of every `collect` (so before
    every scrape, `render` and ``get_sample_value``), on the caller's thread: the gateway
    registers one that sets the GPU gauges from the ledger and the usage window.
    """

    def __init__(self) -> None:
        super().__init__()
        self._before_collect: list[Callable[[], None]] = []

    def on_collect(self, callback: Callable[[], None]) -> None:
        """Call `callback` before every collection (to set gauges read from live state)."""
        self._before_collect.append(callback)

    def collect(self) -> Iterable[Metric]:
        for callback in self._before_collect:
            callback()
        for metric in super().collect():
            created = metric.name + "_created"
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [sample for sample in metric.samples if sample.name != created]
            yield kept

    def render(self) -> str:
        """Every metric in the text exposition format 0.0.4, as ``GET /metrics`` serves it."""
        return generate_latest(self).decode()


CELL_START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
HOST_REPORT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
KERNEL_START_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
MIGRATION_OUTCOMES = ("succeeded", "failed")
START_SOURCES = ("cold", "pool")
"""Where a started kernel's replicas came from: launched for it, or a warm pool's group."""


class FleetMetrics:
    """The gateway's metrics (issue 4 §6), on their own registry.

    Who updates what: the GPU gauges from the ledger and the moving window (on collect, say);
    ``cell_start_delay`` per cell, from execute_request received to execution started;
    ``queued_cells`` when a cell starts or stops waiting; ``degraded_kernels`` when a kernel
    starts or stops missing a replica (`GroupKeeper`); ``migrations`` per replica moved;
    ``hosts_added``/``hosts_removed`` per host the autoscaler started/stopped;
    ``kernel_start`` per kernel, from the create request to the kernel answering;
    ``migration_time`` per replica moved, from asking to the new replica caught up and the old
    one gone; ``scale_out_time`` per host the autoscaler started, until its agent listens;
    ``ledger_breaches`` per breach a checked `GpuLedger` finds; ``kernel_starts`` per kernel
    started, by source; ``pool_ready`` whenever the warm pool gains or loses a group;
    ``loop_lag`` ten times a second, how late the event loop woke a sleeper
    (`kernelfleet.gateway.loop_lag`); ``host_report`` per heartbeat, the time to apply it.
    """

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.total_gpus = Gauge("kernelfleet_total_gpus", "GPUs on alive hosts.", registry=r)
        self.committed_gpus = Gauge(
            "kernelfleet_committed_gpus", "GPUs bound to running cells now.", registry=r
        )
        self.busy_gpus = Gauge(
            "kernelfleet_busy_gpus",
            "GPUs committed to running cells, averaged over the window.",
            registry=r,
        )
        self.demand_gpus = Gauge(
            "kernelfleet_demand_gpus",
            "GPUs subscribed by replicas, averaged over the window.",
            registry=r,
        )
        self.subscription_ratio = Gauge(
            "kernelfleet_subscription_ratio",
            "Cluster subscription ratio: demand GPUs / busy GPUs, within [1, 7].",
            registry=r,
        )
        self.cell_start_delay = Histogram(
            "kernelfleet_cell_start_delay_seconds",
            "Time from a cell's execute_request reaching the gateway to its execution starting.",
            buckets=CELL_START_BUCKETS,
            registry=r,
        )
        self.degraded_kernels = Gauge(
            "kernelfleet_kernels_degraded",
            "Replicated kernels running on fewer live replicas than they want.",
            registry=r,
        )
        self.queued_cells = Gauge(
            "kernelfleet_queued_cells",
            "Cells waiting for GPUs or hosts (queue length).",
            registry=r,
        )
        self.migrations = Counter(
            "kernelfleet_migrations_total",
            "Replicas moved to another host.",
            ["outcome"],
            registry=r,
        )
        for outcome in sorted(MIGRATION_OUTCOMES):  # exported in the order the old renderer had
            self.migrations.labels(outcome)
        self.kernel_starts = Counter(
            "kernelfleet_kernel_starts_total",
            "Kernels started, by where their replicas came from (a warm pool group or launched).",
            ["source"],
            registry=r,
        )
        for source in START_SOURCES:
            self.kernel_starts.labels(source)
        self.pool_ready = Gauge(
            "kernelfleet_kernel_pool_ready",
            "Pre-started replica groups ready to serve a kernel start.",
            registry=r,
        )
        self.pool_target = Gauge(
            "kernelfleet_kernel_pool_target",
            "Replica groups the warm pool keeps now (its size, more after bursts of starts).",
            registry=r,
        )
        self.hosts_added = Counter(
            "kernelfleet_scale_out_hosts_total",
            "Hosts the autoscaler started (scale-outs).",
            registry=r,
        )
        self.hosts_removed = Counter(
            "kernelfleet_scale_in_hosts_total",
            "Hosts the autoscaler stopped (scale-ins).",
            registry=r,
        )
        self.ledger_breaches = Counter(
            "kernelfleet_ledger_breaches_total",
            "GPU ledger invariant breaches found, each once (only with GatewayApp.check_ledger).",
            registry=r,
        )
        self.kernel_start = Histogram(
            "kernelfleet_kernel_start_seconds",
            "Time from a kernel-create request to the kernel answering.",
            buckets=KERNEL_START_BUCKETS,
            registry=r,
        )
        self.migration_time = Histogram(
            "kernelfleet_migration_seconds",
            "Time to move a replica: the new one started and caught up, the old one stopped.",
            buckets=KERNEL_START_BUCKETS,
            registry=r,
        )
        self.scale_out_time = Histogram(
            "kernelfleet_scale_out_seconds",
            "Time for the autoscaler to start a host, until its agent listens.",
            buckets=KERNEL_START_BUCKETS,
            registry=r,
        )

        self.loop_lag = Histogram(
            "kernelfleet_event_loop_lag_seconds",
            "How much later than due the gateway's event loop woke a periodic probe.",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.host_report = Histogram(
            "kernelfleet_host_report_seconds",
            "Time to apply one host agent's heartbeat (its report of GPUs and replicas).",
            buckets=HOST_REPORT_BUCKETS,
            registry=r,
        )

    def render(self) -> str:
        return self.registry.render()
