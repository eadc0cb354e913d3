"""Prometheus text exposition: exact text, a round trip through a small parser, and /metrics."""

from __future__ import annotations

import math
import re

import pytest
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


def test_exact_text_of_each_kind() -> None:
    registry = MetricsRegistry()
    cells = registry.counter("kernelfleet_cells_total", "Cells run.", ["policy"])
    cells.labels("notebookos").inc()
    cells.labels(policy="notebookos").inc(2)
    registry.gauge("kernelfleet_queued_cells", "Cells waiting.").set(3)
    delay = registry.histogram("kernelfleet_delay_seconds", "Delay.", [0.1, 1])
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
        "kernelfleet_delay_seconds_sum 7.15\n"
        "kernelfleet_delay_seconds_count 3.0\n"
    )


def test_help_and_label_values_are_escaped_and_parse_back() -> None:
    registry = MetricsRegistry()
    odd = 'a "quoted" back\\slash\nnewline'
    gauge = registry.gauge("kernelfleet_odd", "Help with \\ and\nnewline.", ["host", "why"])
    gauge.labels(host="h1", why=odd).set(-1.5)
    gauge.labels("h2", "plain").set(math.inf)
    histogram = registry.histogram("kernelfleet_h_seconds", "H.", [1], labels=["host"])
    histogram.labels("x,y").observe(2)
    text = registry.render()
    lines = text.split("\n")
    assert lines[0] == "# HELP kernelfleet_odd Help with \\\\ and\\nnewline."
    escaped = 'a \\"quoted\\" back\\\\slash\\nnewline'
    assert lines[2] == f'kernelfleet_odd{{host="h1",why="{escaped}"}} -1.5'
    families, samples = parse(text)
    assert families["kernelfleet_odd"] == ("gauge", "Help with \\ and\nnewline.")
    assert samples[("kernelfleet_odd", (("host", "h1"), ("why", odd)))] == -1.5
    assert samples[("kernelfleet_odd", (("host", "h2"), ("why", "plain")))] == math.inf
    bucket = ("kernelfleet_h_seconds_bucket", (("host", "x,y"), ("le", "1.0")))
    assert samples[bucket] == 0
    assert samples[("kernelfleet_h_seconds_count", (("host", "x,y"),))] == 1


def test_misuse_is_refused() -> None:
    registry = MetricsRegistry()
    counter = registry.counter("kernelfleet_x_total", "X.")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1)
    with pytest.raises(ValueError, match="registered already"):
        registry.gauge("kernelfleet_x_total", "again")
    with pytest.raises(ValueError, match="ends in _total"):
        registry.counter("kernelfleet_x", "X.")
    with pytest.raises(ValueError, match="invalid metric name"):
        registry.gauge("kernel-fleet", "X.")
    with pytest.raises(ValueError, match="invalid label name"):
        registry.gauge("kernelfleet_y", "Y.", ["__reserved"])
    with pytest.raises(ValueError, match="reserved"):
        registry.histogram("kernelfleet_z", "Z.", [1], labels=["le"])
    labelled = registry.gauge("kernelfleet_w", "W.", ["host"])
    with pytest.raises(ValueError, match="use labels"):
        labelled.set(1)
    with pytest.raises(ValueError, match="takes labels"):
        labelled.labels("a", "b")
    with pytest.raises(ValueError, match="takes labels"):
        labelled.labels(node="a")


def test_fleet_metrics_are_all_exported_from_the_start() -> None:
    metrics = FleetMetrics()
    metrics.registry.on_collect(lambda: metrics.committed_gpus.set(2))
    metrics.cell_start_delay.observe(0.004)
    metrics.migrations.labels("succeeded").inc()
    families, samples = parse(metrics.render())
    assert set(families) == {
        "kernelfleet_total_gpus",
        "kernelfleet_committed_gpus",
        "kernelfleet_busy_gpus",
        "kernelfleet_demand_gpus",
        "kernelfleet_subscription_ratio",
        "kernelfleet_cell_start_delay_seconds",
        "kernelfleet_queued_cells",
        "kernelfleet_migrations_total",
        "kernelfleet_scale_out_hosts_total",
        "kernelfleet_scale_in_hosts_total",
        "kernelfleet_kernel_start_seconds",
        "kernelfleet_ledger_breaches_total",
        "kernelfleet_migration_seconds",
        "kernelfleet_scale_out_seconds",
    }
    assert samples[("kernelfleet_committed_gpus", ())] == 2
    assert samples[("kernelfleet_migrations_total", (("outcome", "failed"),))] == 0
    assert samples[("kernelfleet_migrations_total", (("outcome", "succeeded"),))] == 1
    first = ("kernelfleet_cell_start_delay_seconds_bucket", (("le", "0.005"),))
    assert samples[first] == 1
    assert samples[("kernelfleet_kernel_start_seconds_count", ())] == 0


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
