"""``kernelfleet replay``'s handling of bad input (clear messages, exit status 2), and what it reads
from the gateway besides its cells: the policy, the autoscaler's limits and its counters."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

from kernelfleet.cli import KernelfleetApp
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.replay.app import ReplayApp
from kernelfleet.replay.client import GatewayClient, ReplayError
from kernelfleet.replay.counters import AutoscalerCounts
from kernelfleet.scheduler.trace import read_trace
from kernelfleet.testing import free_port

SLICE = Path(__file__).with_name("june_slice.csv")
HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def run_app(*argv: str) -> None:
    app = ReplayApp()
    app.initialize(argv=[*argv, "--ReplayApp.progress=False"])
    app.start()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "--trace FILE --gateway URL"),
        (("--trace", str(SLICE)), "--trace FILE --gateway URL"),
        (("--gateway", "http://127.0.0.1:1"), "--trace FILE --gateway URL"),
        (("--trace", str(SLICE), "--gateway", "http://x", "--time-scale", "0"), "time scale"),
        (("--trace", str(SLICE), "--gateway", "http://x", "--start", "99999"), "no session"),
    ],
)
def test_missing_or_impossible_arguments(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        run_app(*argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_trace_row_is_named(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "0,1,0,0,a,3,0\n1,1,5,0,a,-1,0\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        run_app("--trace", str(bad), "--gateway", "http://127.0.0.1:1")
    assert "line 3: negative duration -1" in capsys.readouterr().err


def test_an_unreachable_gateway_is_a_clear_error(capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit) as exited:
        run_app("--trace", str(SLICE), "--gateway", url, "--token", "t" * 12)
    assert exited.value.code == 2
    assert f"GET /api/fleet/hosts: cannot reach {url}" in capsys.readouterr().err


def test_replay_is_a_subcommand() -> None:
    assert "replay" in KernelfleetApp.subcommands


class _Fleet(RequestHandler):
    def get(self) -> None:
        self.write({"version": "0.1.0", "policy": "packing", "replicas": 3})


async def _serve(routes: list) -> tuple[HTTPServer, str]:
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(Application(routes))
    server.add_sockets(sockets)
    return server, f"http://127.0.0.1:{sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    ("routes", "expected"), [([(r"/api/fleet", _Fleet)], "packing"), ([], None)]
)
async def test_the_policy_comes_from_the_gateway(routes, expected) -> None:
    """A gateway with ``GET /api/fleet`` names its policy; an older one (404) names none."""
    server, url = await _serve(routes)
    client = GatewayClient(url, "t" * 12)
    try:
        fleet = await client.fleet()
    finally:
        client.close()
        server.stop()
    assumptions = ReplayApp().assumptions(read_trace(SLICE), [], fleet)
    assert assumptions["policy"] == expected
    assert assumptions["replicas"] == (3 if expected else None)


class _Metrics(RequestHandler):
    """The gateway's own metrics, rendered by prometheus_client as the gateway does."""

    metrics: FleetMetrics

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.write(generate_latest(self.metrics.registry))


class _NotMetrics(RequestHandler):
    def get(self) -> None:
        self.write("kernelfleet_scale_out_hosts_total one two three\n")


async def test_the_autoscalers_work_is_read_from_the_gateways_counters() -> None:
    """What the autoscaler did between two readings of ``/metrics``: hosts added and removed,
    replicas moved, and the mean host start and move times over those readings only."""
    metrics = FleetMetrics()
    metrics.hosts_added.inc()
    metrics.scale_out_time.observe(9.0)  # before the replay: not counted
    _Metrics.metrics = metrics
    server, url = await _serve([(r"/metrics", _Metrics)])
    client = GatewayClient(url, "t" * 12)
    try:
        before = await client.metrics()
        metrics.hosts_added.inc(2)
        metrics.scale_out_time.observe(1.0)
        metrics.scale_out_time.observe(2.0)
        metrics.hosts_removed.inc()
        metrics.migrations.labels(outcome="succeeded").inc(3)
        metrics.migrations.labels(outcome="failed").inc()
        for seconds in (2.0, 3.0, 4.0):
            metrics.migration_time.observe(seconds)
        after = await client.metrics()
    finally:
        client.close()
        server.stop()
    counts = AutoscalerCounts.between(before, after)
    assert counts == AutoscalerCounts(2, 1, 1.5, 3, 3.0)
    assert AutoscalerCounts.between(after, after) == AutoscalerCounts(0, 0, None, 0, None)


async def test_metrics_that_are_not_prometheus_text_are_a_clear_error() -> None:
    server, url = await _serve([(r"/metrics", _NotMetrics)])
    client = GatewayClient(url, "t" * 12)
    try:
        with pytest.raises(ReplayError, match="GET /metrics: not Prometheus text"):
            await client.metrics()
    finally:
        client.close()
        server.stop()


def test_the_assumptions_record_the_autoscalers_host_limits() -> None:
    fleet = {
        "policy": "notebookos",
        "replicas": 3,
        "autoscaling": {"min_hosts": 3, "max_hosts": 4, "gpus_per_host": 1, "last_round": None},
    }
    assumptions = ReplayApp().assumptions(read_trace(SLICE), [], fleet)
    assert assumptions["autoscaling"] == {"min_hosts": 3, "max_hosts": 4, "gpus_per_host": 1}
    assert ReplayApp().assumptions(read_trace(SLICE), [], {})["autoscaling"] is None
