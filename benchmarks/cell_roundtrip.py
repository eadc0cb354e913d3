"""Kernel start time and trivial-cell round trip: local kernels versus kernelfleet, in one run.

    python benchmarks/cell_roundtrip.py [--cells 200] [--warmup 10] [--starts 9] [--json OUT]

Configurations; A-D each sit behind their own real ``jupyter server`` subprocess, and the client
talks to it as JupyterLab does (REST, then the kernel websocket with legacy JSON frames):

  A  local kernel (jupyter_server's own kernel manager), stock
  B  local kernel, TCP_NODELAY on the server's kernel websocket (``nodelay_connection.py``)
  C  kernelfleet through ``--gateway-url``, stock gateway relay
  D  kernelfleet through ``--gateway-url`` with the kernelfleet extension
  E  the kernelfleet gateway directly, no jupyter_server

Like-for-like pairs: D vs B and C vs A (only where the kernel runs differs), E vs B (the gateway's
own cost against jupyter_server's local path). Cells are interleaved round-robin across the
configurations, so background load falls on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.gateway.processes import kill_group, terminate
from kernelfleet.testing import (
    V1_PROTOCOL,
    Fleet,
    KernelWebsocket,
    descendants,
    free_port,
    kill_all,
    percentile,
    start_fleet,
)

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import harness  # noqa: E402
from nodelay_connection import LOG_LINE as NODELAY_LOG_LINE  # noqa: E402

CELL = "x = 1"
KERNEL_NAME = "python3"
EXTENSION_LOG_LINE = "kernelfleet: gateway websocket relay passes binary frames, TCP_NODELAY on"
NODELAY_CLASS = "nodelay_connection.NoDelayZMQChannelsWebsocketConnection"
PAIRS = {  # ratio: what it compares
    "D/B": "gateway + extension vs local, Nagle off on both",
    "C/A": "gateway vs local, both stock",
    "E/B": "gateway directly vs local (Nagle off)",
}
LIKE_FOR_LIKE = (
    "Like-for-like: one client (tornado websocket, TCP_NODELAY on its socket, {framing} frames, "
    "cell 'x = 1', timed to execute_reply + idle) for every configuration; A-D are the same "
    "jupyter_server with the same flags except the one under test (B and D both switch Nagle off "
    "on the server's client-facing websocket with the same set_nodelay(True) call in connect, A "
    "and C leave it on); every kernel is the same python3 ipykernel; cells run interleaved "
    "round-robin, so background load hits all configurations alike."
)


@dataclass(frozen=True)
class Config:
    """One configuration: how its jupyter_server is started, and log lines that prove it."""

    key: str
    title: str
    server_args: tuple[str, ...] | None  # None: the client talks to the gateway directly
    must_log: tuple[str, ...] = ()  # the server log must hold these once kernels connected
    must_not_log: tuple[str, ...] = ()


def configurations(gateway_url: str, gateway_token: str) -> list[Config]:
    """The five configurations, A-E; C and D point jupyter_server at the given gateway."""
    without_ext = "--ServerApp.jpserver_extensions={'kernelfleet.extension': False}"
    with_ext = "--ServerApp.jpserver_extensions={'kernelfleet.extension': True}"
    gateway = (f"--gateway-url={gateway_url}", f"--GatewayClient.auth_token={gateway_token}")
    relay_line = f"Connecting to {gateway_url.replace('http', 'ws', 1)}/api/kernels/"
    return [
        Config("A", "local kernel, stock jupyter_server", (without_ext,),
               must_not_log=(NODELAY_LOG_LINE, EXTENSION_LOG_LINE, relay_line)),
        Config("B", "local kernel, TCP_NODELAY on server websocket",
               (without_ext, f"--ServerApp.kernel_websocket_connection_class={NODELAY_CLASS}"),
               must_log=(NODELAY_LOG_LINE,), must_not_log=(EXTENSION_LOG_LINE, relay_line)),
        Config("C", "kernelfleet via --gateway-url, stock relay", (without_ext, *gateway),
               must_log=(relay_line,), must_not_log=(NODELAY_LOG_LINE, EXTENSION_LOG_LINE)),
        Config("D", "kernelfleet via --gateway-url + extension", (with_ext, *gateway),
               must_log=(relay_line, EXTENSION_LOG_LINE), must_not_log=(NODELAY_LOG_LINE,)),
        Config("E", "kernelfleet gateway directly (no server)", None),
    ]  # fmt: skip


@dataclass
class Endpoint:
    """Where one configuration's client connects: its jupyter_server, or the gateway (E)."""

    config: Config
    url: str
    token: str
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    children: set[int] = field(default_factory=set)
    framing: str | None = None
    """The websocket subprotocol the client offers (None: legacy JSON frames)."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""


# ---- jupyter_server subprocesses ----------------------------------------------------------------


def launch_server(config: Config, root: Path, token: str) -> Endpoint:
    """Start ``jupyter server`` for `config` with its own runtime, config and root folders."""
    assert config.server_args is not None
    work = root / f"server-{config.key}"
    for sub in ("runtime", "config", "notebooks"):
        (work / sub).mkdir(parents=True)
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
        "JUPYTER_CONFIG_DIR": str(work / "config"),  # no user config from ~/.jupyter
        "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        sys.executable, "-m", "jupyter", "server", "--no-browser", "--allow-root",
        f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={work / 'notebooks'}",
        *config.server_args,
    ]  # fmt: skip
    log_path = work / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    return Endpoint(config, f"http://127.0.0.1:{port}", token, process, log_path)


def wait_until_serving(endpoint: Endpoint, timeout: float = 90) -> None:
    """Poll ``GET /api/status`` until the server answers; fail with its log if it exits."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(
        endpoint.url + "/api/status", headers={"Authorization": f"token {endpoint.token}"}
    )
    while True:
        assert endpoint.process is not None
        if endpoint.process.poll() is not None:
            raise RuntimeError(f"server {endpoint.config.key} exited:\n{endpoint.log()[-3000:]}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(request, timeout=2) as response,
        ):
            if response.status == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"server {endpoint.config.key} did not answer in {timeout:.0f} s")
        time.sleep(0.1)


def stop_server(endpoint: Endpoint) -> None:
    """SIGTERM the server (it shuts its kernels down), SIGKILL it and its kernels if they linger."""
    process = endpoint.process
    if process is None:
        return
    if process.poll() is None:
        endpoint.children |= set(descendants(process.pid))
    terminate([process], 15)
    kill_group(process)
    kill_all(endpoint.children)


def check_server_log(endpoint: Endpoint) -> None:
    """Fail unless the server's log proves the configuration is the one intended."""
    text, config = endpoint.log(), endpoint.config
    for line in config.must_log:
        if line not in text:
            raise RuntimeError(f"configuration {config.key}: {line!r} missing from its log")
    for line in config.must_not_log:
        if line in text:
            raise RuntimeError(f"configuration {config.key}: unexpected {line!r} in its log")


# ---- the client: REST and the kernel websocket, as JupyterLab uses them ----------------------


async def call(endpoint: Endpoint, method: str, path: str, body: Any = None) -> Any:
    """One REST call with the endpoint's token; returns the parsed JSON body, or None."""
    response = await AsyncHTTPClient().fetch(
        endpoint.url + path,
        method=method,
        headers={"Authorization": f"token {endpoint.token}", "Content-Type": "application/json"},
        body=None if body is None else json.dumps(body),
        request_timeout=120,
    )
    return json.loads(response.body) if response.body else None


async def open_channels(endpoint: Endpoint, kernel_id: str) -> KernelWebsocket:
    """The kernel websocket, offering the endpoint's framing; Nagle off on the client side."""
    url = endpoint.url.replace("http", "ws", 1)
    url += f"/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}"
    headers = {"Authorization": f"token {endpoint.token}"}
    ws = await websocket_connect(
        HTTPRequest(url, headers=headers, request_timeout=120),
        subprotocols=[endpoint.framing] if endpoint.framing else None,
    )
    ws.protocol.set_nodelay(True)
    return KernelWebsocket(ws)


async def run_cell(kernel: KernelWebsocket) -> float:
    """Seconds from sending ``x = 1`` until its execute_reply and its idle status both arrived."""
    started = time.perf_counter()
    result = await kernel.execute(CELL, timeout=60)
    elapsed = time.perf_counter() - started
    if result.reply.get("status") != "ok":
        raise RuntimeError(f"the cell failed: {result.reply}")
    kernel.unclaimed.clear()  # messages for other requests (connection nudges); not needed
    return elapsed


async def time_kernel_start(endpoint: Endpoint) -> float:
    """Seconds from ``POST /api/kernels`` until the new kernel answered a first execute."""
    started = time.perf_counter()
    kernel_id = (await call(endpoint, "POST", "/api/kernels", {"name": KERNEL_NAME}))["id"]
    try:
        kernel = await open_channels(endpoint, kernel_id)
        try:
            await run_cell(kernel)
            return time.perf_counter() - started
        finally:
            kernel.close()
    finally:
        await call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")


# ---- the measurements --------------------------------------------------------------------------


def rotated(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


async def measure_starts(endpoints: list[Endpoint], samples: int) -> dict[str, list[float]]:
    """`samples` kernel starts per configuration, interleaved round-robin."""
    times: dict[str, list[float]] = {e.config.key: [] for e in endpoints}
    for i in range(samples):
        for endpoint in rotated(endpoints, i):
            times[endpoint.config.key].append(await time_kernel_start(endpoint))
        progress(f"kernel starts: {i + 1}/{samples} rounds")
    return times


async def measure_cells(
    endpoints: list[Endpoint],
    cells: int,
    warmup: int,
    before_shutdown: Callable[[dict[str, str]], Awaitable[None]] | None = None,
) -> dict[str, list[float]]:
    """One kernel per configuration; `warmup` cells each, then `cells` timed, interleaved.
    `before_shutdown`, if given, is awaited with each configuration's kernel id once the cells
    are done, while the kernels still run (to inspect them idle)."""
    started: list[tuple[Endpoint, str]] = []
    kernels: dict[str, KernelWebsocket] = {}
    try:
        for endpoint in endpoints:
            kernel_id = (await call(endpoint, "POST", "/api/kernels", {"name": KERNEL_NAME}))["id"]
            started.append((endpoint, kernel_id))
            kernels[endpoint.config.key] = await open_channels(endpoint, kernel_id)
        for kernel in kernels.values():
            for _ in range(warmup):
                await run_cell(kernel)
        times: dict[str, list[float]] = {key: [] for key in kernels}
        for i in range(cells):
            for key in rotated(list(kernels), i):
                times[key].append(await run_cell(kernels[key]))
            if (i + 1) % 50 == 0 or i + 1 == cells:
                progress(f"cells: {i + 1}/{cells} rounds")
        if before_shutdown is not None:
            await before_shutdown({e.config.key: kernel_id for e, kernel_id in started})
        return times
    finally:
        for kernel in kernels.values():
            kernel.close()
        for endpoint, kernel_id in started:
            with contextlib.suppress(Exception):
                await call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")


async def benchmark(endpoints: list[Endpoint], args: argparse.Namespace) -> dict[str, Any]:
    """Both measurements, then the log checks that prove each configuration is what it claims."""
    progress(f"timing {args.starts} kernel starts per configuration")
    starts = await measure_starts(endpoints, args.starts)
    progress(f"timing {args.cells} cells per configuration after {args.warmup} warm-up cells")
    cells = await measure_cells(endpoints, args.cells, args.warmup)
    for endpoint in endpoints:
        check_server_log(endpoint)
    return summarize(endpoints, starts, cells, args)


# ---- results -----------------------------------------------------------------------------------


def summarize(
    endpoints: list[Endpoint],
    starts: dict[str, list[float]],
    cells: dict[str, list[float]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The JSON document: machine, parameters, per-configuration figures, ratios."""
    results: dict[str, Any] = {}
    for endpoint in endpoints:
        key, ms = endpoint.config.key, [t * 1000 for t in cells[endpoint.config.key]]
        results[key] = {
            "title": endpoint.config.title,
            "kernel_start_s": {"median": statistics.median(starts[key]), "samples": starts[key]},
            "roundtrip_ms": {
                "p50": statistics.median(ms), "p99": percentile(ms, 99),
                "mean": statistics.fmean(ms), "n": len(ms),
            },
        }  # fmt: skip
    ratios = {pair: ratio(results[pair[0]], results[pair[2]]) for pair in PAIRS}
    return {
        "machine": harness.describe_machine(),
        "parameters": {
            "cells": args.cells,
            "warmup": args.warmup,
            "kernel_starts": args.starts,
            "cell": CELL,
            "framing": args.framing,
            "replicas": args.replicas,
        },
        "configurations": results,
        "ratios": ratios,
        "like_for_like": LIKE_FOR_LIKE.format(framing=args.framing),
    }


def ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, float]:
    figures = {
        "kernel_start": numerator["kernel_start_s"]["median"]
        / denominator["kernel_start_s"]["median"]
    }
    for stat in ("p50", "p99", "mean"):
        figures[stat] = numerator["roundtrip_ms"][stat] / denominator["roundtrip_ms"][stat]
    return figures


def render(report: dict[str, Any]) -> str:
    """The human-readable table."""
    m, p = report["machine"], report["parameters"]

    def columns(spread: str) -> str:
        return f"{'start med':>9} {spread:>11} {'p50':>9} {'p99':>9} {'mean':>9}"

    lines = [
        f"{m['cpus']} CPUs, Python {m['python']}, jupyter_server {m['jupyter_server']}, "
        f"ipykernel {m['ipykernel']}, tornado {m['tornado']}; {p['cells']} cells after "
        f"{p['warmup']} warm-up, {p['kernel_starts']} kernel starts per configuration",
        "",
        f"{'configuration':<52} {columns('(min-max)')}",
    ]
    for key, r in report["configurations"].items():
        rt, start = r["roundtrip_ms"], r["kernel_start_s"]
        spread = f"({min(start['samples']):.2f}-{max(start['samples']):.2f})"
        lines.append(
            f"{key}  {r['title']:<49} {start['median']:>7.2f} s {spread:>11} "
            f"{rt['p50']:>6.2f} ms {rt['p99']:>6.2f} ms {rt['mean']:>6.2f} ms"
        )
    lines += ["", f"{'ratio':<52} {columns('')}"]
    for pair, r in report["ratios"].items():
        lines.append(
            f"{pair:<5}{PAIRS[pair]:<47} {r['kernel_start']:>8.2f}x {'':>11} {r['p50']:>8.2f}x "
            f"{r['p99']:>8.2f}x {r['mean']:>8.2f}x"
        )
    lines += ["", report["like_for_like"]]
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------


def progress(message: str) -> None:
    harness.progress("cell_roundtrip", message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=200, help="timed cells per configuration")
    parser.add_argument("--warmup", type=int, default=10, help="untimed cells first, per kernel")
    parser.add_argument("--starts", type=int, default=9, help="kernel starts per configuration")
    harness.add_output_arguments(parser, kept="server logs")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=[1, 2, 3],
        help="replicas per kernelfleet kernel (3: a Raft group, state synced after every cell)",
    )
    parser.add_argument(
        "--framing",
        choices=["legacy", "v1"],
        default="legacy",
        help="websocket framing the client offers (JupyterLab offers v1; stock gateway mode "
        "falls back to legacy in C)",
    )
    args = parser.parse_args(argv)
    if args.cells < 1 or args.starts < 1 or args.warmup < 0:
        parser.error("--cells and --starts must be at least 1, --warmup at least 0")
    return args


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet and the four servers, measure, and stop every process whatever happens."""
    fleet: Fleet | None = None
    servers: list[Endpoint] = []
    try:
        progress(
            f"starting the kernelfleet gateway and 3 host agents, {args.replicas} replicas/kernel"
        )
        fleet = start_fleet(
            root / "fleet", hosts=3, gpus=2, token=secrets.token_hex(16), replicas=args.replicas
        )
        configs = configurations(fleet.url, fleet.token)
        server_token = secrets.token_hex(16)
        progress("starting 4 jupyter_server subprocesses")
        for config in configs:
            if config.server_args is not None:
                servers.append(launch_server(config, root, server_token))
        for server in servers:
            wait_until_serving(server)
        direct = Endpoint(configs[-1], fleet.url, fleet.token)
        endpoints = [*servers, direct]
        for endpoint in endpoints:
            endpoint.framing = V1_PROTOCOL if args.framing == "v1" else None
        return asyncio.run(benchmark(endpoints, args))
    finally:
        progress("stopping every process")
        for server in servers:
            stop_server(server)
        if fleet is not None:
            fleet.stop()


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("cell_roundtrip", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
