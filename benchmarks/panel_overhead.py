"""What the JupyterLab panel costs a cell: a trivial cell's round trip through jupyter_server's
gateway path with the kernelfleet extension disabled, loaded, and loaded with a panel following
the kernel, in one run against one fleet.

    python benchmarks/panel_overhead.py [--cells 200] [--warmup 10] [--json OUT]

  off    ``kernelfleet.extension`` disabled (stock gateway relay, legacy framing)
  on     the extension loaded (its relay, v1 framing as JupyterLab offers it), no panel open
  panel  as ``on``, plus what an open panel does: the proxied event stream
         (``/kernelfleet/api/events``) read live, and after events of its kernel the kernel
         model, the fleet and the sections fetched again, at most once a second (as the
         panel's model, extension/src/model.ts, throttles it)

Cells are interleaved round-robin across the three, so background load falls on all alike.
``panel/on`` is the panel's own cost; ``on/off`` the extension's (its relay included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.testing import V1_PROTOCOL, Fleet, KernelWebsocket, percentile, start_fleet

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import harness  # noqa: E402
from cell_roundtrip import (  # noqa: E402
    KERNEL_NAME,
    Config,
    Endpoint,
    call,
    launch_server,
    open_channels,
    rotated,
    run_cell,
    stop_server,
    wait_until_serving,
)


def configurations(gateway_url: str, token: str) -> list[Config]:
    gateway = (f"--gateway-url={gateway_url}", f"--GatewayClient.auth_token={token}")
    off = "--ServerApp.jpserver_extensions={'kernelfleet.extension': False}"
    on = "--ServerApp.jpserver_extensions={'kernelfleet.extension': True}"
    return [
        Config("off", "extension disabled", (off, *gateway)),
        Config("on", "extension loaded, no panel", (on, *gateway)),
        Config("panel", "extension loaded, panel following the kernel", (on, *gateway)),
    ]


COALESCE_S = 0.1  # extension/src/model.ts: COALESCE_MS
MIN_REFRESH_INTERVAL_S = 1.0  # and MIN_REFRESH_INTERVAL_MS


class Panel:
    """What the browser panel does on the server: follow the events, re-fetch on each."""

    def __init__(self, endpoint: Endpoint, kernel_id: str) -> None:
        self.endpoint, self.kernel_id = endpoint, kernel_id
        self.events = self.fetches = 0
        self.task: asyncio.Task[None] | None = None
        self.pending: asyncio.Future[None] | None = None
        self.last_refresh = 0.0

    async def start(self) -> None:
        url = self.endpoint.url.replace("http", "ws", 1) + "/kernelfleet/api/events"
        headers = {"Authorization": f"token {self.endpoint.token}"}
        try:
            ws = await websocket_connect(HTTPRequest(url, headers=headers))
        except Exception as error:  # the gateway has no event routes (before issue 11's events)
            progress(f"panel: no event stream ({error}); the panel only fetches")
            ws = None
        self.task = asyncio.ensure_future(self._follow(ws))

    async def _follow(self, ws: Any) -> None:
        while ws is not None:
            message = await ws.read_message()
            if message is None:
                return
            self.events += 1
            if json.loads(message).get("kernel_id") == self.kernel_id and self.pending is None:
                since = time.monotonic() - self.last_refresh
                delay = max(COALESCE_S, MIN_REFRESH_INTERVAL_S - since)
                self.pending = asyncio.ensure_future(self._refresh_after(delay))

    async def _refresh_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.pending = None
        self.last_refresh = time.monotonic()
        await self.refresh()

    async def refresh(self) -> None:
        await asyncio.gather(
            call(self.endpoint, "GET", f"/kernelfleet/api/kernels/{self.kernel_id}"),
            call(self.endpoint, "GET", "/kernelfleet/api/fleet"),
            call(self.endpoint, "GET", f"/kernelfleet/api/sections?kernel={self.kernel_id}"),
        )
        self.fetches += 1

    def stop(self) -> None:
        for task in (self.task, self.pending):
            if task is not None:
                task.cancel()


async def measure(endpoints: list[Endpoint], cells: int, warmup: int) -> dict[str, Any]:
    started: list[tuple[Endpoint, str]] = []
    kernels: dict[str, KernelWebsocket] = {}
    panel: Panel | None = None
    try:
        for endpoint in endpoints:
            kernel_id = (await call(endpoint, "POST", "/api/kernels", {"name": KERNEL_NAME}))["id"]
            started.append((endpoint, kernel_id))
            kernels[endpoint.config.key] = await open_channels(endpoint, kernel_id)
            if endpoint.config.key == "panel":
                panel = Panel(endpoint, kernel_id)
                await panel.start()
                await panel.refresh()
        for kernel in kernels.values():
            for _ in range(warmup):
                await run_cell(kernel)
        times: dict[str, list[float]] = {key: [] for key in kernels}
        for i in range(cells):
            for key in rotated(list(kernels), i):
                times[key].append(await run_cell(kernels[key]))
        return {"times": times, "panel_events": panel.events if panel else 0,
                "panel_fetches": panel.fetches if panel else 0}  # fmt: skip
    finally:
        if panel is not None:
            panel.stop()
        for kernel in kernels.values():
            kernel.close()
        for endpoint, kernel_id in started:
            with contextlib.suppress(Exception):
                await call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")


def summarize(measured: dict[str, Any], configs: list[Config]) -> dict[str, Any]:
    figures = {}
    for config in configs:
        ms = [t * 1000 for t in measured["times"][config.key]]
        figures[config.key] = {
            "title": config.title,
            "n": len(ms),
            "median": statistics.median(ms),
            "p90": percentile(ms, 90),
        }
    median = {key: f["median"] for key, f in figures.items()}
    return {
        "roundtrip_ms": figures,
        "ratios": {
            "panel/on": median["panel"] / median["on"],
            "on/off": median["on"] / median["off"],
        },
        "panel_events": measured["panel_events"],
        "panel_fetches": measured["panel_fetches"],
        "machine": harness.describe_machine(),
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        "trivial cell round trip through jupyter_server (ms)",
        f"{'':7}{'median':>9}{'p90':>9}  n",
    ]
    for key, f in report["roundtrip_ms"].items():
        lines.append(f"{key:7}{f['median']:9.2f}{f['p90']:9.2f}  {f['n']}  {f['title']}")
    lines.append(
        f"panel/on {report['ratios']['panel/on']:.3f}   on/off {report['ratios']['on/off']:.3f}   "
        f"(the panel saw {report['panel_events']} events, "
        f"re-fetched {report['panel_fetches']} times)"
    )
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"[panel_overhead] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=200, help="timed cells per configuration")
    parser.add_argument("--warmup", type=int, default=10, help="untimed cells first, per kernel")
    harness.add_output_arguments(parser, kept="server logs")
    args = parser.parse_args(argv)
    if args.cells < 1 or args.warmup < 0:
        parser.error("--cells must be at least 1, --warmup at least 0")
    return args


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    fleet: Fleet | None = None
    servers: list[Endpoint] = []
    try:
        progress("starting the gateway, 3 host agents and 3 jupyter_server subprocesses")
        fleet = start_fleet(root / "fleet", hosts=3, gpus=2, token=secrets.token_hex(16))
        configs = configurations(fleet.url, fleet.token)
        token = secrets.token_hex(16)
        servers = [launch_server(config, root, token) for config in configs]
        for server in servers:
            wait_until_serving(server)
            if server.config.key != "off":
                server.framing = V1_PROTOCOL
        progress(f"timing {args.cells} cells per configuration after {args.warmup} warm-up cells")
        return summarize(asyncio.run(measure(servers, args.cells, args.warmup)), configs)
    finally:
        for server in servers:
            stop_server(server)
        if fleet is not None:
            fleet.stop()


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("panel_overhead", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
