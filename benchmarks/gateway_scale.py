"""The gateway and its host agents holding many kernels: what they cost and how cells fare.

    python benchmarks/gateway_scale.py [--kernels 200] [--replicated-kernels 40] [--rate 20]
        [--stream-seconds 30] [--idle-seconds 10] [--batch 8] [--polls 50]
        [--memory-floor-mib 3072] [--json OUT] [--keep] [--quick]

Two fleets, one after the other, each started as the other benchmarks start theirs
(`kernelfleet.testing.start_fleet`: a gateway and host agents as subprocesses, no warm pool):

  single      1 host agent, kernels of 1 replica (``--replicas 1``): ``--kernels`` of them.
              The gateway's figures at that count: one agent holds them all.
  replicated  3 host agents, kernels of 3 replicas: ``--replicated-kernels`` of them (each
              agent holds one replica of every kernel). 200 of these do not fit in 23 GB.

For each fleet, with 1 kernel open, then with all of them (started ``--batch`` at a time, each
with a websocket open through the gateway, as JupyterLab keeps one per notebook):

- the gateway's CPU (share of one core) and RSS, from ``/proc/<pid>``, over ``--idle-seconds``
  with no cells, and during the stream below; its open file descriptors;
- a steady stream of ``x = 1`` cells at ``--rate`` cells a second in all, round robin over
  every open kernel, for ``--stream-seconds``: p50 / p99 of the round trip (execute_request to
  its reply and idle). Open loop: each cell's clock starts when it is due, so a cell that waits
  behind its kernel's previous one counts that wait. The ratio to the 1-kernel stream (same
  rate, same run) is what holding N kernels costs a cell;
- the gateway's event-loop lag (``kernelfleet_event_loop_lag_seconds`` on ``/metrics``, the
  change over each window: mean, share of wake-ups later than 10 / 50 / 100 ms, and the bucket
  bound of p99) and the time it took to apply each host heartbeat
  (``kernelfleet_host_report_seconds``);
- ``GET /api/kernels`` and ``GET /api/fleet/hosts`` (what JupyterLab and the fleet panel poll):
  ``--polls`` calls one after the other when idle, and one a second each during the stream;
- each host agent's CPU and RSS, idle and during the stream;
- the memory of the idle kernels (PSS and RSS of every replica process under the agents, as
  ``kernel_memory.py`` reads them), per kernel and per replica, and how many more would fit in
  the memory available now (``MemAvailable``);
- host losses (``missed its heartbeats`` / ``lost`` in the gateway's log): 0 expected.

Starting kernels stops early, and says so, if ``MemAvailable`` falls under
``--memory-floor-mib``: the machine is shared. ``--quick`` (6 + 2 kernels, a 3-second stream) is
what the test suite runs: it checks that every figure is written, never what it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.testing import Fleet, KernelWebsocket, descendants, percentile, start_fleet

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import harness  # noqa: E402
import kernel_memory  # noqa: E402

CELL = "x = 1"
KERNEL_NAME = "python3"
WARMUP_CELLS = 3
IDLE_SETTLE_S = 1.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LAG = "kernelfleet_event_loop_lag_seconds"
REPORTS = "kernelfleet_host_report_seconds"
HOST_LOSS = re.compile(r"host \S+ (missed its heartbeats|lost:)")


def progress(message: str) -> None:
    harness.progress("gateway_scale", message)


# ---- processes: CPU, memory, descriptors from /proc ---------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` used so far (``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid}: no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


@dataclass
class CpuWindow:
    """CPU use of some processes between `start` and `stop`: a share of one core each."""

    pids: dict[str, int]
    _cpu: dict[str, float] = field(default_factory=dict)
    _wall: float = 0.0

    def start(self) -> None:
        self._cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._wall = time.monotonic()

    def stop(self) -> dict[str, dict[str, float]]:
        wall = time.monotonic() - self._wall
        return {
            name: {
                "cpu_percent": 100 * (cpu_seconds(pid) - self._cpu[name]) / wall,
                "rss_mib": rss_mib(pid),
            }
            for name, pid in self.pids.items()
        }


# ---- the gateway's histograms ------------------------------------------------------------------


def histograms(text: str, name: str) -> dict[str, float]:
    """The cumulative buckets (by ``le``), ``sum`` and ``count`` of histogram `name` in a
    ``/metrics`` text."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.startswith(f"{name}_bucket{{"):
            found[sample.split('le="', 1)[1].rstrip('"}')] = float(value)
        elif sample in (f"{name}_sum", f"{name}_count"):
            found[sample.rsplit("_", 1)[1]] = float(value)
    if "count" not in found:
        raise RuntimeError(f"{name} is not on the gateway's /metrics")
    return found


def histogram_change(
    before: dict[str, float], after: dict[str, float], over_s: tuple[float, ...] = ()
) -> dict[str, Any]:
    """What a histogram gained between two scrapes: samples, mean, the bucket bound of p50 and
    p99 (None beyond the top bucket), and the share of samples above each of `over_s`."""
    gained = {key: after[key] - before.get(key, 0.0) for key in after}
    count = gained.pop("count")
    total = gained.pop("sum")
    bounds = sorted((float(le), n) for le, n in gained.items())

    def bound_of(q: float) -> float | None:
        for le, n in bounds:
            if n >= q / 100 * count:
                return None if math.isinf(le) else le
        return None

    def bound_ms(q: float) -> float | None:
        bound = bound_of(q)
        return None if bound is None else 1000 * bound

    summary: dict[str, Any] = {
        "samples": int(count),
        "mean_ms": 1000 * total / count if count else 0.0,
        "p50_le_ms": bound_ms(50),
        "p99_le_ms": bound_ms(99),
    }
    for threshold in over_s:
        under = next(n for le, n in bounds if le >= threshold)
        summary[f"over_{round(threshold * 1000)}ms"] = (count - under) / count if count else 0.0
    return summary


# ---- the client: REST and websockets straight to the gateway -----------------------------------


async def call(fleet: Fleet, method: str, path: str, body: Any = None) -> tuple[Any, int]:
    """One REST call with the fleet token: (parsed JSON body or None, body size in bytes)."""
    response = await AsyncHTTPClient().fetch(
        fleet.url + path,
        method=method,
        headers={"Authorization": f"token {fleet.token}", "Content-Type": "application/json"},
        body=None if body is None else json.dumps(body),
        request_timeout=180,
    )
    return (json.loads(response.body) if response.body else None), len(response.body or b"")


@dataclass
class OpenKernel:
    """A kernel with its websocket; one cell at a time on it."""

    id: str
    ws: KernelWebsocket
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def cell(self) -> None:
        async with self.lock:
            result = await self.ws.execute(CELL, timeout=120)
            self.ws.unclaimed.clear()  # messages of no request of ours
        if result.reply.get("status") != "ok":
            raise RuntimeError(f"kernel {self.id}: the cell failed: {result.reply}")

    async def cell_due(self, due: float) -> float | str:
        """Run the cell; seconds from `due` (loop time) to its reply and idle status, or why
        it failed (a failed cell is counted, and the stream goes on)."""
        try:
            await self.cell()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return asyncio.get_running_loop().time() - due


async def open_kernel(fleet: Fleet) -> OpenKernel:
    """``POST /api/kernels``, its websocket, and one cell answered. A kernel that started but
    whose websocket or cell then failed is shut down before the error is raised."""
    model, _ = await call(fleet, "POST", "/api/kernels", {"name": KERNEL_NAME})
    try:
        url = fleet.ws_url(model["id"], secrets.token_hex(8))
        headers = {"Authorization": f"token {fleet.token}"}
        ws = await websocket_connect(HTTPRequest(url, headers=headers, request_timeout=180))
        ws.protocol.set_nodelay(True)  # type: ignore[union-attr]
        kernel = OpenKernel(model["id"], KernelWebsocket(ws))
        await kernel.cell()
    except Exception:
        with contextlib.suppress(Exception):
            await call(fleet, "DELETE", f"/api/kernels/{model['id']}")
        raise
    return kernel


@dataclass
class Started:
    kernels: list[OpenKernel]
    seconds: list[float]
    wall_s: float
    failures: list[str]
    stopped_early: str | None


async def open_kernels(
    fleet: Fleet, count: int, batch: int, memory_floor_mib: float, label: str
) -> Started:
    """Open `count` kernels, `batch` at a time; a kernel that fails to start is counted (with
    its error), not retried. Stops early when MemAvailable is under `memory_floor_mib`."""
    kernels: list[OpenKernel] = []
    seconds: list[float] = []
    failures: list[str] = []
    stopped_early = None
    began = time.monotonic()

    async def one() -> None:
        started = time.monotonic()
        try:
            kernels.append(await open_kernel(fleet))
            seconds.append(time.monotonic() - started)
        except Exception as e:  # counted and reported: a start failing at scale is a finding
            failures.append(f"{type(e).__name__}: {e}")

    while len(kernels) + len(failures) < count:
        available = mem_available_mib()
        if available < memory_floor_mib:
            stopped_early = (
                f"MemAvailable {available:.0f} MiB < --memory-floor-mib {memory_floor_mib:.0f} "
                f"after {len(kernels)} kernels"
            )
            progress(f"{label}: stopped starting kernels: {stopped_early}")
            break
        size = min(batch, count - len(kernels) - len(failures))
        await asyncio.gather(*(one() for _ in range(size)))
        progress(
            f"{label}: {len(kernels)}/{count} kernels open ({len(failures)} failed), "
            f"{time.monotonic() - began:.0f} s, MemAvailable {available:.0f} MiB"
        )
    return Started(kernels, seconds, time.monotonic() - began, failures, stopped_early)


async def close_kernels(fleet: Fleet, kernels: list[OpenKernel], batch: int) -> float:
    """Close the websockets and ``DELETE`` every kernel, `batch` at a time; seconds taken."""
    began = time.monotonic()
    for kernel in kernels:
        kernel.ws.close()
    for i in range(0, len(kernels), batch):
        await asyncio.gather(
            *(call(fleet, "DELETE", f"/api/kernels/{k.id}") for k in kernels[i : i + batch])
        )
    return time.monotonic() - began


# ---- the measurements --------------------------------------------------------------------------


def latencies_ms(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "p50": statistics.median(ms), "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms), "n": len(ms),
    }  # fmt: skip


POLLED = {"kernels": "/api/kernels", "hosts": "/api/fleet/hosts"}


async def poll_api(fleet: Fleet, times: int) -> dict[str, Any]:
    """`times` calls of each polled endpoint, one after the other: latency and body size."""
    figures: dict[str, Any] = {}
    for name, path in POLLED.items():
        seconds, size = [], 0
        for _ in range(times):
            began = time.perf_counter()
            _, size = await call(fleet, "GET", path)
            seconds.append(time.perf_counter() - began)
        figures[name] = {**latencies_ms(seconds), "bytes": size}
    return figures


async def poll_while(fleet: Fleet, done: asyncio.Event) -> dict[str, Any]:
    """Each polled endpoint once a second until `done`: latency (during a stream)."""
    seconds: dict[str, list[float]] = {name: [] for name in POLLED}
    while not done.is_set():
        for name, path in POLLED.items():
            began = time.perf_counter()
            await call(fleet, "GET", path)
            seconds[name].append(time.perf_counter() - began)
        await asyncio.wait([asyncio.ensure_future(done.wait())], timeout=1.0)
    return {name: latencies_ms(s) for name, s in seconds.items()}


async def stream(kernels: list[OpenKernel], rate: float, seconds: float) -> dict[str, Any]:
    """`rate` cells a second in all for `seconds`, round robin over `kernels` (open loop)."""
    loop = asyncio.get_running_loop()
    cells = max(1, round(rate * seconds))
    began = loop.time()
    running = []
    for i in range(cells):
        due = began + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        running.append(asyncio.ensure_future(kernels[i % len(kernels)].cell_due(due)))
    outcomes = await asyncio.gather(*running)
    round_trips = [t for t in outcomes if isinstance(t, float)]
    failures = [t for t in outcomes if isinstance(t, str)]
    if not round_trips:
        raise RuntimeError(f"every cell of the stream failed: {failures[:3]}")
    return {
        **latencies_ms(round_trips),
        "failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "rate_per_s": rate,
        "achieved_rate_per_s": cells / (loop.time() - began),
        "kernels": len(kernels),
    }


@dataclass
class Watch:
    """The fleet's processes and its /metrics, for before/after windows."""

    fleet: Fleet

    @property
    def pids(self) -> dict[str, int]:
        assert self.fleet.gateway is not None
        return {"gateway": self.fleet.gateway.pid} | {
            host: process.pid for host, process in self.fleet.hosts.items()
        }

    def scrape(self) -> tuple[dict[str, float], dict[str, float]]:
        text = self.fleet.request_text("GET", "/metrics")
        return histograms(text, LAG), histograms(text, REPORTS)

    async def window(self, work: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        """Run `work`; the processes' CPU and RSS over it, the loop lag and heartbeat handling
        it saw, and what it returned (``result``)."""
        cpu = CpuWindow(self.pids)
        lag, reports = self.scrape()
        cpu.start()
        result = await work()
        processes = cpu.stop()
        for name, pid in self.pids.items():
            processes[name]["open_fds"] = open_fds(pid)
        lag_after, reports_after = self.scrape()
        gateway = processes.pop("gateway")
        return {
            "gateway": gateway,
            "agents": processes,
            "loop_lag": histogram_change(lag, lag_after, (0.01, 0.05, 0.1)),
            "host_reports": histogram_change(reports, reports_after, (0.01,)),
            "result": result,
        }


async def idle(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def streamed_with_polls(
    fleet: Fleet, kernels: list[OpenKernel], args: argparse.Namespace
) -> dict[str, Any]:
    done = asyncio.Event()
    polls = asyncio.ensure_future(poll_while(fleet, done))
    try:
        cells = await stream(kernels, args.rate, args.stream_seconds)
    finally:
        done.set()
    return {"cells_ms": cells, "api_ms": await polls}


async def at_scale(fleet: Fleet, kernels: list[OpenKernel], args: argparse.Namespace) -> Any:
    """The figures with `kernels` open: idle, then under the stream."""
    watch = Watch(fleet)
    for kernel in kernels[:1]:
        for _ in range(WARMUP_CELLS):
            await kernel.cell()
    idle_window = await watch.window(lambda: idle(args.idle_seconds))
    idle_window["result"] = None
    api_idle = await poll_api(fleet, args.polls)
    streamed = await watch.window(lambda: streamed_with_polls(fleet, kernels, args))
    result = streamed.pop("result")
    return {
        "kernels": len(kernels),
        "idle": {k: v for k, v in idle_window.items() if k != "result"},
        "api_idle_ms": api_idle,
        "stream": streamed,
        "cells_ms": result["cells_ms"],
        "api_during_stream_ms": result["api_ms"],
    }


def idle_kernel_memory(fleet: Fleet, kernels: int) -> dict[str, Any]:
    """PSS / RSS of every kernel process under the agents, per kernel and per process, and how
    many more kernels of that size fit in what the machine has available now."""
    pids = [pid for process in fleet.hosts.values() for pid in descendants(process.pid)]
    memory = kernel_memory.memory_of(pids)
    per_kernel = memory["pss_mib"] / kernels
    available = mem_available_mib()
    return {
        **memory,
        "pss_mib_per_kernel": per_kernel,
        "rss_mib_per_kernel": memory["rss_mib"] / kernels,
        "pss_mib_per_process": memory["pss_mib"] / memory["processes"],
        "mem_available_mib": available,
        "more_kernels_fit": math.floor(available / per_kernel),
        "kernels_fit_in_all": kernels + math.floor(available / per_kernel),
    }


def host_losses(fleet: Fleet) -> int:
    return len(HOST_LOSS.findall(fleet.log("gateway")))


async def measure_fleet(
    fleet: Fleet, count: int, args: argparse.Namespace, label: str
) -> dict[str, Any]:
    """1 kernel, then `count`: the figures at each; memory of the idle kernels; shutdown."""
    opened: list[OpenKernel] = []
    try:
        progress(f"{label}: 1 kernel: {args.idle_seconds:.0f} s idle, then the stream")
        first = await open_kernels(fleet, 1, 1, 0, label)
        if not first.kernels:
            raise RuntimeError(f"{label}: the first kernel did not start: {first.failures}")
        opened += first.kernels
        one = await at_scale(fleet, opened, args)
        progress(f"{label}: opening {count - 1} more kernels, {args.batch} at a time")
        more = await open_kernels(fleet, count - 1, args.batch, args.memory_floor_mib, label)
        opened += more.kernels
        progress(f"{label}: {len(opened)} kernels: idle, then the stream")
        many = await at_scale(fleet, opened, args)
        await asyncio.sleep(IDLE_SETTLE_S)
        memory = idle_kernel_memory(fleet, len(opened))
        losses = host_losses(fleet)
        progress(f"{label}: shutting {len(opened)} kernels down")
        shutdown_s = await close_kernels(fleet, opened, args.batch)
        opened = []
    finally:
        for kernel in opened:
            kernel.ws.close()
    return {
        "hosts": len(fleet.hosts),
        "replicas": args.replicas_of[label],
        "kernels_wanted": count,
        "one_kernel": one,
        "many_kernels": many,
        "start": {
            "kernels_started": len(more.kernels) + 1,
            "failed": len(more.failures),
            "failures": sorted(set(more.failures))[:5],
            "stopped_early": more.stopped_early,
            "wall_s": more.wall_s,
            "per_kernel_s": latencies_ms(more.seconds) if more.seconds else None,
        },
        "memory": memory,
        "host_losses": losses,
        "shutdown_all_s": shutdown_s,
        "ratios": {stat: many["cells_ms"][stat] / one["cells_ms"][stat] for stat in ("p50", "p99")},
    }


# ---- results -----------------------------------------------------------------------------------


def figure_row(label: str, a: float | None, b: float | None, unit: str) -> str:
    """One line of a table: a figure at 1 kernel, at N kernels, and their ratio."""
    if a is None or b is None:
        return f"{label:<44} {a!s:>12} {b!s:>12}"
    ratio = f"{b / a:>7.2f}x" if a else ""
    return f"{label:<44} {a:>9.2f} {unit:<2} {b:>9.2f} {unit:<2} {ratio}"


def render_fleet(label: str, fleet: dict[str, Any]) -> list[str]:
    one, many, start = fleet["one_kernel"], fleet["many_kernels"], fleet["start"]
    n = many["kernels"]
    stopped = f"; stopped early: {start['stopped_early']}" if start["stopped_early"] else ""
    lines = [
        "",
        f"{label}: {fleet['hosts']} host agent(s), {fleet['replicas']} replica(s) a kernel; "
        f"{n} of {fleet['kernels_wanted']} kernels open ({start['failed']} failed to start"
        f"{stopped}), opened in {start['wall_s']:.0f} s",
        f"{'':<44} {'1 kernel':>12} {f'{n} kernels':>12} {'ratio':>8}",
    ]

    def row(label: str, a: float | None, b: float | None, unit: str = "") -> None:
        lines.append(figure_row(label, a, b, unit))

    c1, cn = one["cells_ms"], many["cells_ms"]
    row(f"cell round trip p50 ({cn['n']} cells)", c1["p50"], cn["p50"], "ms")
    row("cell round trip p99", c1["p99"], cn["p99"], "ms")
    row("cells that failed", c1["failed"], cn["failed"])
    for window in ("idle", "stream"):
        g1, gn = one[window]["gateway"], many[window]["gateway"]
        row(f"gateway CPU, {window} (% of a core)", g1["cpu_percent"], gn["cpu_percent"], "%")
        row(f"gateway RSS, {window}", g1["rss_mib"], gn["rss_mib"], "MB")
        l1, ln = one[window]["loop_lag"], many[window]["loop_lag"]
        row(f"gateway loop lag mean, {window}", l1["mean_ms"], ln["mean_ms"], "ms")
        row(f"  p99 bucket bound, {window}", l1["p99_le_ms"], ln["p99_le_ms"], "ms")
        row(f"  wake-ups > 50 ms, {window} (share)", l1["over_50ms"], ln["over_50ms"])
        h1, hn = one[window]["host_reports"], many[window]["host_reports"]
        row(f"heartbeat handling mean, {window}", h1["mean_ms"], hn["mean_ms"], "ms")
        for host, an in many[window]["agents"].items():
            a1 = one[window]["agents"][host]
            row(f"{host} CPU, {window} (% of a core)", a1["cpu_percent"], an["cpu_percent"], "%")
            row(f"{host} RSS, {window}", a1["rss_mib"], an["rss_mib"], "MB")
    for name in ("gateway", *many["idle"]["agents"]):
        at_1 = one["idle"]["gateway"] if name == "gateway" else one["idle"]["agents"][name]
        at_n = many["idle"]["gateway"] if name == "gateway" else many["idle"]["agents"][name]
        row(f"{name} open file descriptors", at_1["open_fds"], at_n["open_fds"])
    for name, path in POLLED.items():
        for when, which in (("api_idle_ms", "idle"), ("api_during_stream_ms", "stream")):
            a, b = one[when][name], many[when][name]
            row(f"GET {path} p50, {which}", a["p50"], b["p50"], "ms")
            row(f"GET {path} p99, {which}", a["p99"], b["p99"], "ms")
    mem = fleet["memory"]
    return [
        *lines,
        f"idle kernels' memory: {mem['processes']} processes, PSS "
        f"{mem['pss_mib_per_kernel']:.1f} MiB a kernel ({mem['pss_mib_per_process']:.1f} a "
        f"process), RSS {mem['rss_mib_per_kernel']:.1f} MiB a kernel",
        f"MemAvailable {mem['mem_available_mib']:.0f} MiB: {mem['more_kernels_fit']} more "
        f"fit, {mem['kernels_fit_in_all']} in all on this machine",
        f"host losses: {fleet['host_losses']}; shutting {n} kernels down: "
        f"{fleet['shutdown_all_s']:.1f} s",
    ]


def render(report: dict[str, Any]) -> str:
    m, p, load = report["machine"], report["parameters"], report["load_average_1min"]
    lines = [
        f"{m['cpus']} CPUs, Python {m['python']}, ipykernel {m['ipykernel']}; "
        f"{p['rate']} cells/s for {p['stream_seconds']} s; load {load['before']:.1f} -> "
        f"{load['after']:.1f}",
    ]
    for label, fleet in report["fleets"].items():
        lines += (
            [f"\n{label}: FAILED: {fleet['error']}"]
            if "error" in fleet
            else render_fleet(label, fleet)
        )
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", type=int, default=200, help="1-replica kernels, 1 agent")
    parser.add_argument(
        "--replicated-kernels", type=int, default=40, help="3-replica kernels on 3 agents (0: skip)"
    )
    parser.add_argument("--rate", type=float, default=20.0, help="cells a second, in all")
    parser.add_argument("--stream-seconds", type=float, default=30.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=8, help="kernels started at once")
    parser.add_argument("--polls", type=int, default=50, help="idle API calls per endpoint")
    parser.add_argument(
        "--memory-floor-mib", type=float, default=3072,
        help="stop starting kernels when MemAvailable falls under this",
    )  # fmt: skip
    harness.add_output_arguments(parser, kept="logs")
    parser.add_argument(
        "--quick", action="store_true",
        help="6 + 2 kernels, a 3-second stream at 10 cells/s: for the test suite",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.kernels, args.replicated_kernels, args.rate = 6, 2, 10.0
        args.stream_seconds, args.idle_seconds, args.batch, args.polls = 3.0, 2.0, 3, 5
    if args.kernels < 2 or args.replicated_kernels == 1 or args.replicated_kernels < 0:
        parser.error("--kernels must be at least 2, --replicated-kernels 0 or at least 2")
    if args.rate <= 0 or args.stream_seconds <= 0 or args.idle_seconds <= 0:
        parser.error("--rate, --stream-seconds and --idle-seconds must be positive")
    if args.batch < 1 or args.polls < 1:
        parser.error("--batch and --polls must be at least 1")
    args.replicas_of = {"single": 1, "replicated": 3}
    return args


async def benchmark(root: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    AsyncHTTPClient.configure(None, max_clients=max(16, 2 * args.batch))
    plan = [("single", 1, 1, args.kernels)]
    if args.replicated_kernels:
        plan.append(("replicated", 3, 3, args.replicated_kernels))
    results = {}
    for label, hosts, replicas, count in plan:
        progress(f"{label}: starting a gateway and {hosts} host agent(s), {replicas} replica(s)")
        fleet = start_fleet(
            root / label, hosts=hosts, gpus=2, token=secrets.token_hex(16), replicas=replicas
        )
        try:
            results[label] = await measure_fleet(fleet, count, args, label)
        except Exception as e:  # the other fleet's figures still count; this one says why
            progress(f"{label}: failed: {type(e).__name__}: {e}")
            results[label] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        finally:
            progress(f"{label}: host losses in the gateway's log: {host_losses(fleet)}")
            fleet.stop()
    return results


PARAMETERS = (
    "kernels", "replicated_kernels", "rate", "stream_seconds", "idle_seconds", "batch", "polls",
    "memory_floor_mib",
)  # fmt: skip


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    fleets = asyncio.run(benchmark(root, args))
    return {
        "machine": harness.describe_machine(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "parameters": {**{key: getattr(args, key) for key in PARAMETERS}, "cell": CELL},
        "fleets": fleets,
    }


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("gateway_scale", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
