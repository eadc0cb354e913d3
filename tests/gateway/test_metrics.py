"""The gateway's metrics on prometheus_client: the exposition it served before (families, types,
HELP, label sets; no ``_created`` series), one private registry per gateway, gauges set at scrape
time, and ``GET /metrics`` behind the token."""

from __future__ import annotations

import re

import prometheus_client
import pytest
from prometheus_client import Counter, Gauge, Histogram
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from kernelfleet.gateway.handlers.metrics import MetricsHandler
from kernelfleet.gateway.metrics import FleetMetrics, MetricsRegistry

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(?P<key>[a-zA-Z_]\w*)="(?P<value>(?:[^"\\]|\\.)*)"')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> tuple[dict[str, tuple[str, str]], dict[tuple, float]]:
    """Families ({name: (type, help)}) and samples ({(name, ((label, value), ...)): value}),
    checking the format's rules on the way: HELP then TYPE before a family's samples, every
    sample in a declared family, one trailing newline."""
    assert text.endswith("\n")
    assert not text.endswith("\n\n")
    families: dict[str, tuple[str, str]] = {}
    samples: dict[tuple, float] = {}
    current = None
    help_text = ""
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            current, _, help_text = line[7:].partition(" ")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current, f"TYPE for {name} follows HELP for {current}"
            assert kind in {"counter", "gauge", "histogram"}
            families[name] = (kind, re.sub(r"\\\\|\\n", lambda m: UNESCAPE[m[0]], help_text))
        else:
            match = SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name = match["name"]
            assert current is not None
            assert name == current or name in {
                f"{current}{s}" for s in ("_bucket", "_sum", "_count")
            }
            raw = match["labels"] or ""
            labels = tuple(
                (m["key"], re.sub(r'\\\\|\\"|\\n', lambda e: UNESCAPE[e[0]], m["value"]))
                for m in LABEL.finditer(raw)
            )
            assert ",".join(f'{k}="{v}"' for k, v in LABEL.findall(raw)) == raw
            samples[(name, labels)] = float(match["value"].replace("Inf", "inf"))
    return families, samples


CELL_BOUNDS = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0")
CELL_BOUNDS += ("10.0", "30.0", "60.0", "300.0", "900.0", "+Inf")
KERNEL_BOUNDS = ("0.25", "0.5", "1.0", "2.0", "3.0", "5.0", "10.0", "20.0", "30.0", "60.0")
KERNEL_BOUNDS += ("120.0", "+Inf")
LAG_BOUNDS = ("0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0")
LAG_BOUNDS += ("2.5", "5.0", "+Inf")
REPORT_BOUNDS = ("0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25")
REPORT_BOUNDS += ("0.5", "1.0", "+Inf")
BOUNDS = {
    "kernelfleet_cell_start_delay_seconds": CELL_BOUNDS,
    "kernelfleet_event_loop_lag_seconds": LAG_BOUNDS,
    "kernelfleet_host_report_seconds": REPORT_BOUNDS,
}
FAMILIES = {  # as the gateway exported them before prometheus_client, HELP texts unescaped
    "kernelfleet_total_gpus": ("gauge", "GPUs on alive hosts."),
    "kernelfleet_committed_gpus": ("gauge", "GPUs bound to running cells now."),
    "kernelfleet_busy_gpus": (
        "gauge",
        "GPUs committed to running cells, averaged over the window.",
    ),
    "kernelfleet_demand_gpus": ("gauge", "GPUs subscribed by replicas, averaged over the window."),
    "kernelfleet_subscription_ratio": (
        "gauge",
        "Cluster subscription ratio: demand GPUs / busy GPUs, within [1, 7].",
    ),
    "kernelfleet_cell_start_delay_seconds": (
        "histogram",
        "Time from a cell's execute_request reaching the gateway to its execution starting.",
    ),
    "kernelfleet_queued_cells": ("gauge", "Cells waiting for GPUs or hosts (queue length)."),
    "kernelfleet_kernels_degraded": (
        "gauge",
        "Replicated kernels running on fewer live replicas than they want.",
    ),
    "kernelfleet_migrations_total": ("counter", "Replicas moved to another host."),
    "kernelfleet_kernel_starts_total": (
        "counter",
        "Kernels started, by where their replicas came from (a warm pool group or launched).",
    ),
    "kernelfleet_kernel_pool_ready": (
        "gauge",
        "Pre-started replica groups ready to serve a kernel start.",
    ),
    "kernelfleet_kernel_pool_target": (
        "gauge",
        "Replica groups the warm pool keeps now (its size, more after bursts of starts).",
    ),
    "kernelfleet_scale_out_hosts_total": ("counter", "Hosts the autoscaler started (scale-outs)."),
    "kernelfleet_scale_in_hosts_total": ("counter", "Hosts the autoscaler stopped (scale-ins)."),
    "kernelfleet_ledger_breaches_total": (
        "counter",
        "GPU ledger invariant breaches found, each once (only with GatewayApp.check_ledger).",
    ),
    "kernelfleet_kernel_start_seconds": (
        "histogram",
        "Time from a kernel-create request to the kernel answering.",
    ),
    "kernelfleet_migration_seconds": (
        "histogram",
        "Time to move a replica: the new one started and caught up, the old one stopped.",
    ),
    "kernelfleet_scale_out_seconds": (
        "histogram",
        "Time for the autoscaler to start a host, until its agent listens.",
    ),
    # added since (issue 16, scale): not in the exposition before prometheus_client
    "kernelfleet_event_loop_lag_seconds": (
        "histogram",
        "How much later than due the gateway's event loop woke a periodic probe.",
    ),
    "kernelfleet_host_report_seconds": (
        "histogram",
        "Time to apply one host agent's heartbeat (its report of GPUs and replicas).",
    ),
}


def expected_series() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every (sample name, labels) the gateway exports (those it exported before
    prometheus_client, and the two histograms added since)."""
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for name, (kind, _) in FAMILIES.items():
        if kind == "histogram":
            bounds = BOUNDS.get(name, KERNEL_BOUNDS)
            series.update((f"{name}_bucket", (("le", bound),)) for bound in bounds)
            series.update({(f"{name}_sum", ()), (f"{name}_count", ())})
        elif name == "kernelfleet_migrations_total":
            series.update((name, (("outcome", o),)) for o in ("failed", "succeeded"))
        elif name == "kernelfleet_kernel_starts_total":
            series.update((name, (("source", s),)) for s in ("cold", "pool"))
        else:
            series.add((name, ()))
    return series


def test_fleet_metrics_keep_their_names_types_help_and_labels() -> None:
    metrics = FleetMetrics()
    metrics.registry.on_collect(lambda: metrics.committed_gpus.set(2))
    metrics.cell_start_delay.observe(0.004)
    metrics.migrations.labels("succeeded").inc()
    metrics.kernel_start.observe(1.5)
    text = metrics.render()
    families, samples = parse(text)
    assert families == FAMILIES
    assert set(samples) == expected_series()
    assert "_created" not in text
    assert samples[("kernelfleet_committed_gpus", ())] == 2
    assert samples[("kernelfleet_migrations_total", (("outcome", "failed"),))] == 0
    assert samples[("kernelfleet_migrations_total", (("outcome", "succeeded"),))] == 1
    assert samples[("kernelfleet_cell_start_delay_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("kernelfleet_kernel_start_seconds_bucket", (("le", "1.0"),))] == 0
    assert samples[("kernelfleet_kernel_start_seconds_bucket", (("le", "2.0"),))] == 1
    assert samples[("kernelfleet_kernel_start_seconds_sum", ())] == 1.5
    assert samples[("kernelfleet_migration_seconds_count", ())] == 0


def test_exact_text_of_each_kind() -> None:
    registry = MetricsRegistry()
    cells = Counter("kernelfleet_cells_total", "Cells run.", ["policy"], registry=registry)
    cells.labels("notebookos").inc()
    cells.labels(policy="notebookos").inc(2)
    Gauge("kernelfleet_queued_cells", "Cells waiting.", registry=registry).set(3)
    delay = Histogram("kernelfleet_delay_seconds", "Delay.", buckets=[0.1, 1], registry=registry)
    delay.observe(0.05)
    delay.observe(0.1)  # a bound is inclusive
    delay.observe(7)
    assert registry.render() == (
        "# HELP kernelfleet_cells_total Cells run.\n"
        "# TYPE kernelfleet_cells_total counter\n"
        'kernelfleet_cells_total{policy="notebookos"} 3.0\n'
        "# HELP kernelfleet_queued_cells Cells waiting.\n"
        "# TYPE kernelfleet_queued_cells gauge\n"
        "kernelfleet_queued_cells 3.0\n"
        "# HELP kernelfleet_delay_seconds Delay.\n"
        "# TYPE kernelfleet_delay_seconds histogram\n"
        'kernelfleet_delay_seconds_bucket{le="0.1"} 2.0\n'
        'kernelfleet_delay_seconds_bucket{le="1.0"} 2.0\n'
        'kernelfleet_delay_seconds_bucket{le="+Inf"} 3.0\n'
        "kernelfleet_delay_seconds_count 3.0\n"
        "kernelfleet_delay_seconds_sum 7.15\n"
    )


def test_collect_callbacks_run_before_every_scrape() -> None:
    metrics = FleetMetrics()
    scrapes: list[int] = []

    def set_gauges() -> None:
        scrapes.append(len(scrapes))
        metrics.total_gpus.set(10 * len(scrapes))

    metrics.registry.on_collect(set_gauges)
    assert scrapes == [], "nothing runs before a scrape"
    assert parse(metrics.render())[1][("kernelfleet_total_gpus", ())] == 10
    assert parse(metrics.render())[1][("kernelfleet_total_gpus", ())] == 20
    assert metrics.registry.get_sample_value("kernelfleet_total_gpus") == 30
    assert scrapes == [0, 1, 2]


def test_each_gateway_counts_on_its_own_registry() -> None:
    first, second = FleetMetrics(), FleetMetrics()  # the global registry would refuse the second
    first.hosts_added.inc(3)
    assert first.registry.get_sample_value("kernelfleet_scale_out_hosts_total") == 3
    assert second.registry.get_sample_value("kernelfleet_scale_out_hosts_total") == 0
    global_names = {metric.name for metric in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("kernelfleet_") for name in global_names)


def test_values_read_back_from_the_registry() -> None:
    metrics = FleetMetrics()
    metrics.queued_cells.set(4)
    metrics.queued_cells.dec()
    metrics.ledger_breaches.inc()
    metrics.migrations.labels(outcome="failed").inc(2)
    value = metrics.registry.get_sample_value
    assert value("kernelfleet_queued_cells") == 3
    assert value("kernelfleet_ledger_breaches_total") == 1
    assert value("kernelfleet_migrations_total", {"outcome": "failed"}) == 2
    assert value("kernelfleet_migrations_total", {"outcome": "succeeded"}) == 0


async def test_metrics_endpoint_needs_the_token() -> None:
    metrics = FleetMetrics()
    metrics.queued_cells.set(4)
    app = Application(
        [(r"/metrics", MetricsHandler)], token="metrics-token-123", metrics=metrics.registry
    )
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/metrics"
    client = AsyncHTTPClient(force_instance=True)
    try:
        response = await client.fetch(url, headers={"Authorization": "token metrics-token-123"})
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        _, samples = parse(response.body.decode())
        assert samples[("kernelfleet_queued_cells", ())] == 4
        query = await client.fetch(url + "?token=metrics-token-123")
        assert query.code == 200
        for headers, status in (({}, 401), ({"Authorization": "token wrong"}, 403)):
            with pytest.raises(HTTPClientError) as refused:
                await client.fetch(url, headers=headers)
            assert refused.value.code == status
            assert refused.value.response is not None
            assert refused.value.response.headers["Content-Type"].startswith("application/json")
    finally:
        client.close()
        server.stop()
        await server.close_all_connections()
