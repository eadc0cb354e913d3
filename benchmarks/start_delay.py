"""Cell start delay (p50/p95/p99), with and without contention for GPUs (issue 4).

    python benchmarks/start_delay.py [--hosts 3] [--gpus-per-host 1] [--replicas 3]
        [--kernels 3] [--contended-kernels 6] [--cells 40] [--cell-seconds 0.2] [--json OUT]

Start delay of a cell: from the client handing its ``execute_request`` to its socket until the
executor's ``execute_input`` for it arrives on IOPub. Not ``status: busy``: the gateway says busy
itself while a cell waits for GPUs, so busy marks the gateway's answer, not the cell starting.

One run measures, one scenario after the other, each kernel running `--cells` cells of
``time.sleep(--cell-seconds)`` back to back, all kernels of a scenario at once. Each fleet
scenario gets a fleet of its own (gateway + host agents with virtual GPUs, started by
``kernelfleet.testing.start_fleet`` in a temporary folder, stopped after it):

  local        plain local ipykernels (jupyter_client), as many as `--kernels`: the baseline
  fleet-0gpu   `--kernels` fleet kernels without KERNEL_GPUS: the gateway's own overhead
  uncontended  `--kernels` fleet kernels with KERNEL_GPUS=1, no more than there are GPUs
  contended    `--contended-kernels` kernels with KERNEL_GPUS=1, more than there are GPUs:
               cells queue for a GPU ("kernelfleet: waiting for 1 GPU ...")

Each kernel first runs one untimed cell. Cross-checks beside the client's figures: the gateway's
own histogram (``kernelfleet_cell_start_delay_seconds`` on ``GET /metrics``, read before and
after the timed cells of a scenario); its queued-cells and committed-GPU gauges, sampled while
cells run; which cells the gateway said were waiting, and whether a later one got GPUs first;
and for the contended case the delay that queueing alone explains (`queueing_model`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from kernelfleet.testing import Fleet, KernelWebsocket, percentile, start_fleet

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

WARMUP_CELL = "import time"
CELL = "time.sleep({seconds})"
METRIC = "kernelfleet_cell_start_delay_seconds"
WAITING = re.compile(r"kernelfleet: waiting for .*?(\d+) cells? ahead of you")
CELL_TIMEOUT = 300.0
KERNEL_START_ATTEMPTS = 3
GAUGES = ("kernelfleet_queued_cells", "kernelfleet_committed_gpus", "kernelfleet_total_gpus")
GAUGE_INTERVAL = 0.1


@dataclass
class CellTiming:
    """One timed cell, on this process's `time.monotonic` clock."""

    kernel: int
    sent: float
    started: float  # its execute_input arrived
    ended: float  # its status: idle arrived
    queued_at: float | None = None  # the gateway's "waiting for ..." arrived (it queued)
    granted_at: float | None = None  # the gateway's "waited N s for ..." arrived (GPUs bound)
    ahead: int | None = None  # "N cells ahead of you", the first time it said so
    said: list[str] = field(default_factory=list)  # other gateway notes before it started
    executor: str | None = None  # the session of its execute_input: which replica ran it

    @property
    def waited(self) -> bool:
        return self.queued_at is not None

    @property
    def delay(self) -> float:
        return self.started - self.sent

    @property
    def run(self) -> float:
        return self.ended - self.started


# ---- the two clients: fleet kernels over the gateway's websocket, local kernels over ZMQ -------


class FleetKernel:
    """A fleet kernel's websocket; times cells by their execute_input and idle messages."""

    def __init__(self, index: int, kernel_id: str, ws: KernelWebsocket) -> None:
        self.index, self.kernel_id, self.ws = index, kernel_id, ws

    async def run_cell(self, code: str) -> CellTiming:
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        msg_id = self.ws.send("execute_request", content)
        sent = time.monotonic()
        cell = CellTiming(self.index, sent, math.nan, math.nan)
        status = None
        deadline = sent + CELL_TIMEOUT
        while math.isnan(cell.ended) or status is None:
            msg = await self.ws.receive(max(0.01, deadline - time.monotonic()))
            now = time.monotonic()
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = msg["header"]["msg_type"], msg["content"]
            if kind == "execute_input" and math.isnan(cell.started):
                cell.started = now
                cell.executor = str(msg["header"].get("session", ""))  # one per replica
            elif kind == "status" and body.get("execution_state") == "idle":
                cell.ended = now
            elif kind == "execute_reply":
                status = body.get("status")
            elif kind in ("display_data", "update_display_data"):
                note(cell, str(body.get("data", {}).get("text/plain", "")), now)
        if status != "ok" or math.isnan(cell.started):
            raise RuntimeError(f"kernel {self.kernel_id}: cell {code!r} ended {status}")
        return cell


def note(cell: CellTiming, text: str, now: float) -> None:
    """What the gateway said about a cell before it ran: it queued, it got its GPUs, other."""
    found = WAITING.search(text)
    if found:
        if cell.queued_at is None:
            cell.queued_at, cell.ahead = now, int(found.group(1))
    elif text.startswith("kernelfleet: waited"):
        cell.granted_at = now
    elif text and text not in cell.said:
        cell.said.append(text)  # a replica moving, say


class LocalKernel:
    """A plain ipykernel started by jupyter_client, timed the same way."""

    def __init__(self, index: int, manager: AsyncKernelManager) -> None:
        self.index, self.manager = index, manager
        self.client = manager.client()

    async def run_cell(self, code: str) -> CellTiming:
        msg_id = self.client.execute(code)
        sent = time.monotonic()
        started = ended = None
        deadline = sent + CELL_TIMEOUT
        while ended is None:
            msg = await self.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "execute_input" and started is None:
                started = time.monotonic()
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                ended = time.monotonic()
        reply = await self.client.get_shell_msg(timeout=CELL_TIMEOUT)
        if reply["content"]["status"] != "ok" or started is None:
            raise RuntimeError(f"local kernel: cell {code!r} ended {reply['content']['status']}")
        return CellTiming(self.index, sent, started, ended)


async def run_kernels(kernels: list[Any], cells: int, code: str) -> dict[str, Any]:
    """Every kernel runs `cells` cells back to back, all kernels at once: the timings, the wall
    time, and the machine's 1-minute load average before and after."""

    async def one(kernel: Any) -> list[CellTiming]:
        return [await kernel.run_cell(code) for _ in range(cells)]

    load = os.getloadavg()[0]
    started = time.monotonic()
    per_kernel = await asyncio.gather(*(one(kernel) for kernel in kernels))
    return {
        "timings": [t for timings in per_kernel for t in timings],
        "wall_s": time.monotonic() - started,
        "load_avg_1min": [load, os.getloadavg()[0]],
    }


# ---- scenarios ---------------------------------------------------------------------------------


async def local_scenario(root: Path, count: int, cells: int, code: str) -> dict[str, Any]:
    kernels: list[LocalKernel] = []
    try:
        for i in range(count):
            manager = AsyncKernelManager(
                kernel_name="python3", connection_file=str(root / f"local-{i}.json")
            )
            with (root / f"local-{i}.log").open("wb") as log:  # the kernel keeps its own fd
                await manager.start_kernel(stdout=log, stderr=subprocess.STDOUT)
            kernels.append(LocalKernel(i, manager))
        for kernel in kernels:
            kernel.client.start_channels()
            await kernel.client.wait_for_ready(timeout=60)
            await kernel.run_cell(WARMUP_CELL)
        return {**await run_kernels(kernels, cells, code), "gateway": None}
    finally:
        for kernel in kernels:
            kernel.client.stop_channels()
            with contextlib.suppress(Exception):
                await kernel.manager.shutdown_kernel(now=True)


async def fleet_scenario(
    fleet: Fleet, count: int, env: dict[str, str], cells: int, code: str
) -> dict[str, Any]:
    ids: list[str] = []
    kernels: list[FleetKernel] = []
    failures: list[str] = []
    try:
        for _ in range(count):  # one at a time: the gateway places each after the previous
            ids.append(await create_kernel(fleet, env, failures))
        for i, kernel_id in enumerate(ids):
            kernels.append(FleetKernel(i, kernel_id, await fleet.connect(kernel_id)))
        await asyncio.gather(*(kernel.run_cell(WARMUP_CELL) for kernel in kernels))
        before = parse_histogram(await asyncio.to_thread(fleet.request_text, "GET", "/metrics"))
        done = asyncio.Event()
        sampler = asyncio.ensure_future(sample_gauges(fleet, done))
        try:
            result = await run_kernels(kernels, cells, code)
        finally:
            done.set()
        gauges = await sampler
        after = parse_histogram(await asyncio.to_thread(fleet.request_text, "GET", "/metrics"))
        return {
            **result,
            "gateway": histogram_delta(before, after),
            "gauges": gauges,
            "kernel_start_failures": failures,
        }
    finally:
        for kernel in kernels:
            kernel.ws.close()
        for kernel_id in ids:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(fleet.request, "DELETE", f"/api/kernels/{kernel_id}")


async def create_kernel(fleet: Fleet, env: dict[str, str], failures: list[str]) -> str:
    """``POST /api/kernels``; a start that failed (500) is recorded in `failures` and tried
    again (twice): the figures are about cells, but the report says that kernels failed."""
    body = {"name": "python3", "env": env}
    for _ in range(KERNEL_START_ATTEMPTS):
        status, payload = await asyncio.to_thread(fleet.request, "POST", "/api/kernels", body)
        if status == 201:
            return str(payload["id"])
        if status != 500:  # refused (503 no-capacity, 400): trying again changes nothing
            raise RuntimeError(f"the gateway refused a kernel: {status} {payload}")
        failures.append(f"{status}: {payload}")
        progress(f"a kernel failed to start ({status}: {payload}); trying again")
    raise RuntimeError(f"no kernel started in {KERNEL_START_ATTEMPTS} tries: {failures}")


# ---- the gateway's own view: its histogram and GPU gauges ---------------------------------------


async def sample_gauges(fleet: Fleet, done: asyncio.Event) -> dict[str, Any]:
    """Read the gateway's GPU gauges every `GAUGE_INTERVAL` s until `done`: how often cells
    queued while some GPU was free (a moment after each release is normal; more is not)."""
    samples: list[tuple[float, float, float]] = []
    while not done.is_set():
        text = await asyncio.to_thread(fleet.request_text, "GET", "/metrics")
        queued, committed, total = (gauge(text, name) for name in GAUGES)
        samples.append((queued, committed, total))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), GAUGE_INTERVAL)
    waits = [s for s in samples if s[0] > 0]
    return {
        "samples": len(samples),
        "queued_fraction": len(waits) / len(samples) if samples else 0.0,
        "free_gpu_while_queued_fraction": (
            sum(s[1] < s[2] for s in waits) / len(samples) if samples else 0.0
        ),
        "mean_committed_gpus": statistics.fmean(s[1] for s in samples) if samples else 0.0,
    }


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    if found is None:
        raise RuntimeError(f"{name} missing from the gateway's /metrics")
    return float(found.group(1))


def parse_histogram(text: str) -> dict[str, Any]:
    """`METRIC`'s cumulative buckets (upper bound -> count), sum and count from /metrics."""
    buckets: dict[float, float] = {}
    total = count = None
    for line in text.splitlines():
        if not line.startswith(METRIC):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith(f"{METRIC}_bucket"):
            bound = re.search(r'le="([^"]+)"', name)
            assert bound is not None, line
            buckets[float(bound.group(1))] = float(value)
        elif name == f"{METRIC}_sum":
            total = float(value)
        elif name == f"{METRIC}_count":
            count = float(value)
    if not buckets or total is None or count is None:
        raise RuntimeError(f"{METRIC} missing from the gateway's /metrics")
    return {"buckets": buckets, "sum": total, "count": count}


def histogram_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What was observed between two readings: count, mean, and bucket-bounded percentiles."""
    count = int(after["count"] - before["count"])
    buckets = {le: after["buckets"][le] - before["buckets"].get(le, 0) for le in after["buckets"]}

    def bound(q: float) -> float | None:  # the upper bound of the bucket holding rank q
        rank = max(1, math.ceil(q / 100 * count))
        return next((le for le, n in sorted(buckets.items()) if n >= rank), None) if count else None

    return {
        "n": count,
        "mean_ms": (after["sum"] - before["sum"]) / count * 1000 if count else None,
        "p50_le_ms": _ms(bound(50)),
        "p99_le_ms": _ms(bound(99)),
        "buckets": {format_bound(le): int(n) for le, n in sorted(buckets.items())},
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def format_bound(le: float) -> str:
    return "+Inf" if math.isinf(le) else f"{le:g}"


# ---- results -----------------------------------------------------------------------------------


def delay_figures(timings: list[CellTiming]) -> dict[str, Any]:
    ms = [t.delay * 1000 for t in timings]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "mean_ms": statistics.fmean(ms),
    }


def overtakes(timings: list[CellTiming], margin: float = 0.01) -> int:
    """Cells that queued and were overtaken: another kernel's cell that reached the gateway
    more than `margin` s after this one queued got its GPUs first. Zero if waiting cells are
    served first come, first served. Arrival: when the cell queued (the gateway's message),
    else when it was sent; GPUs bound: when the gateway said so, else when the cell started."""

    def arrived(t: CellTiming) -> float:
        return t.sent if t.queued_at is None else t.queued_at

    def granted(t: CellTiming) -> float:
        return t.started if t.granted_at is None else t.granted_at

    queued = [t for t in timings if t.queued_at is not None]
    return sum(
        any(arrived(o) > arrived(t) + margin and granted(o) < granted(t) for o in timings)
        for t in queued
    )


def summarize(title: str, kernels: int, gpus: int, result: dict[str, Any]) -> dict[str, Any]:
    timings: list[CellTiming] = result["timings"]
    dispatch = [(t.started - t.granted_at) * 1000 for t in timings if t.granted_at is not None]
    per_kernel = [
        statistics.fmean(t.delay * 1000 for t in timings if t.kernel == k) for k in range(kernels)
    ]
    summary = {
        "title": title,
        "kernels": kernels,
        "gpus_per_kernel": gpus,
        "start_delay": delay_figures(timings),
        "cell_run_ms": statistics.fmean(t.run * 1000 for t in timings),
        "dispatch_ms": statistics.fmean(dispatch) if dispatch else None,
        "executors": len({t.executor for t in timings}),
        "wall_s": result["wall_s"],
        "cells_waited": sum(t.waited for t in timings),
        "max_ahead": max((t.ahead for t in timings if t.ahead is not None), default=None),
        "overtaken": overtakes(timings),
        "gateway_notes": sorted({text for t in timings for text in t.said}),
        "kernel_mean_ms_min_max": [min(per_kernel), max(per_kernel)],
        "gateway_histogram": result["gateway"],
        "gateway_gauges": result.get("gauges"),
        "load_avg_1min": result["load_avg_1min"],
        "kernel_start_failures": result.get("kernel_start_failures", []),
        "timings": [asdict(t) for t in timings],
    }
    if result["gateway"] is not None:
        hop = summary["start_delay"]["mean_ms"] - (result["gateway"]["mean_ms"] or 0)
        summary["client_minus_gateway_mean_ms"] = hop
        summary["gateway_count_matches"] = result["gateway"]["n"] == len(timings)
    return summary


def queueing_model(scenarios: dict[str, Any], total_gpus: int) -> dict[str, Any]:
    """What the contended figure should be, from what one cell costs. A kernel cycles: its cell
    queues (Q), its GPU is bound and the cell dispatched (D, bound -> execute_input), the cell
    runs (R, execute_input -> idle), the next is sent. The GPU is held for about D + R; with K
    kernels on G GPUs that are never idle, a cycle lasts K/G x (D + R), so Q ~ (K/G - 1) x
    (D + R) and the start delay Q + D ~ (K/G - 1) x (D + R) + D. Check: G x wall time / cells
    is the GPU time each cell really took."""
    contended = scenarios["contended"]
    ratio = contended["kernels"] / total_gpus
    dispatch = contended["dispatch_ms"] or 0.0
    hold = dispatch + contended["cell_run_ms"]
    return {
        "kernels_per_gpu": ratio,
        "dispatch_ms": dispatch,
        "run_ms": contended["cell_run_ms"],
        "expected_mean_ms": max(0.0, ratio - 1) * hold + dispatch,
        "measured_mean_ms": contended["start_delay"]["mean_ms"],
        "gpu_ms_per_cell": total_gpus * contended["wall_s"] * 1000 / contended["start_delay"]["n"],
    }


def render(report: dict[str, Any]) -> str:
    """The human-readable table."""
    m, p = report["machine"], report["parameters"]
    lines = [
        f"{m['cpus']} CPUs, Python {m['python']}, ipykernel {m['ipykernel']}; fleet of "
        f"{p['hosts']} hosts x {p['gpus_per_host']} virtual GPU(s), {p['replicas']} replicas per "
        f"kernel; {p['cells']} cells of {p['cell']!r} per kernel, kernels concurrent",
        "start delay = execute_request sent -> its execute_input received (client clock)",
        "",
        f"{'scenario':<12} {'kernels':>7} {'n':>4} {'p50':>9} {'p95':>9} {'p99':>9} {'max':>9} "
        f"{'mean':>9} {'waited':>6} {'overtaken':>9} {'load':>9}   gateway histogram: n, mean, "
        "p50, p99",
    ]
    for key, s in report["scenarios"].items():
        d, g = s["start_delay"], s["gateway_histogram"]
        gateway = "-"
        if g is not None:
            gateway = (
                f"{g['n']}, {_fmt(g['mean_ms'])}, <={_fmt(g['p50_le_ms'])}, "
                f"<={_fmt(g['p99_le_ms'])}"
            )
        load = "{:.1f}-{:.1f}".format(*s["load_avg_1min"])
        lines.append(
            f"{key:<12} {s['kernels']:>7} {d['n']:>4} {_fmt(d['p50_ms']):>9} "
            f"{_fmt(d['p95_ms']):>9} {_fmt(d['p99_ms']):>9} {_fmt(d['max_ms']):>9} "
            f"{_fmt(d['mean_ms']):>9} {s['cells_waited']:>6} {s['overtaken']:>9} {load:>9}   "
            f"{gateway}"
        )
    r, q = report["ratios"], report["queueing"]
    contended = report["scenarios"]["contended"]
    spread, gauges = contended["kernel_mean_ms_min_max"], contended["gateway_gauges"]
    lines += [
        "",
        f"uncontended p50 / local p50: {r['uncontended_p50_over_local_p50']:.1f}x;  "
        f"0-GPU p50 / local p50: {r['zero_gpu_p50_over_local_p50']:.1f}x",
        f"contended, {q['kernels_per_gpu']:.2f} kernels per GPU: expected mean start delay ~ "
        f"(K/G - 1) x (D + R) + D = {max(0, q['kernels_per_gpu'] - 1):.2f} x "
        f"({_fmt(q['dispatch_ms'])} + {_fmt(q['run_ms'])}) + {_fmt(q['dispatch_ms'])} = "
        f"{_fmt(q['expected_mean_ms'])}; measured mean {_fmt(q['measured_mean_ms'])}",
        "  D: GPUs bound -> execute_input (the gateway's 'waited' note to the cell start), R: the "
        "cell's run (execute_input -> idle); a GPU is held ~D + R per cell, measured "
        f"{_fmt(q['gpu_ms_per_cell'])} (GPUs x wall time / cells); per-kernel mean start delay "
        f"{_fmt(spread[0])} to {_fmt(spread[1])}",
        f"  gateway gauges every {GAUGE_INTERVAL:g} s ({gauges['samples']} samples): cells queued "
        f"in {gauges['queued_fraction']:.0%}, queued while a GPU was free in "
        f"{gauges['free_gpu_while_queued_fraction']:.0%}, mean committed GPUs "
        f"{gauges['mean_committed_gpus']:.2f}",
        "waited: cells the gateway told 'kernelfleet: waiting for ...'; overtaken: of those, cells "
        "that another kernel's cell, arriving > 10 ms after it queued, got GPUs before; load: the "
        "machine's 1-minute load average before-after (figures mean little when it exceeds the "
        "CPUs)",
    ]
    for key, s in report["scenarios"].items():
        for failure in s["kernel_start_failures"]:
            lines.append(f"WARNING {key}: a kernel failed to start (started again): {failure}")
        if s.get("gateway_count_matches") is False:
            lines.append(
                f"WARNING {key}: the gateway observed {s['gateway_histogram']['n']} start delays "
                f"for {s['start_delay']['n']} timed cells"
            )
        if s["gateway_notes"]:
            lines.append(f"NOTE {key}: the gateway also said {s['gateway_notes'][:3]}")
    return "\n".join(lines)


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


# ---- main --------------------------------------------------------------------------------------


def progress(message: str) -> None:
    harness.progress("start_delay", message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=3, help="host agents")
    parser.add_argument("--gpus-per-host", type=int, default=1, help="virtual GPUs per host")
    parser.add_argument("--replicas", type=int, default=3, help="replicas per fleet kernel")
    parser.add_argument(
        "--kernels", type=int, help="kernels without contention (default: one per GPU)"
    )
    parser.add_argument(
        "--contended-kernels", type=int, help="kernels with contention (default: two per GPU)"
    )
    parser.add_argument("--cells", type=int, default=40, help="timed cells per kernel")
    parser.add_argument("--cell-seconds", type=float, default=0.2, help="each cell's sleep")
    harness.add_output_arguments(parser, kept="fleet logs")
    args = parser.parse_args(argv)
    gpus = args.hosts * args.gpus_per_host
    args.kernels = gpus if args.kernels is None else args.kernels
    args.contended_kernels = 2 * gpus if args.contended_kernels is None else args.contended_kernels
    if args.hosts < 1 or args.gpus_per_host < 1 or not 1 <= args.replicas <= args.hosts:
        parser.error("--hosts and --gpus-per-host must be at least 1, --replicas 1 to --hosts")
    if not 1 <= args.kernels <= gpus:
        parser.error(f"--kernels must be 1 to {gpus} (the GPUs): it is the uncontended case")
    if args.contended_kernels <= gpus:
        parser.error(f"--contended-kernels must exceed the {gpus} GPUs")
    if args.cells < 1 or args.cell_seconds < 0:
        parser.error("--cells must be at least 1, --cell-seconds at least 0")
    return args


async def benchmark(root: Path, args: argparse.Namespace, fleets: list[Fleet]) -> dict[str, Any]:
    """Every scenario in turn; each fleet scenario on a fleet of its own (appended to `fleets`,
    stopped when its scenario ends), so no scenario inherits another's kernels, histogram or
    subscription-ratio window."""
    code = CELL.format(seconds=args.cell_seconds)
    gpus = args.hosts * args.gpus_per_host
    plan = [  # name, title, kernels, KERNEL_GPUS
        ("local", "local ipykernel (jupyter_client)", args.kernels, None),
        ("fleet-0gpu", "fleet, KERNEL_GPUS unset", args.kernels, None),
        ("uncontended", f"fleet, KERNEL_GPUS=1, {args.kernels} kernels", args.kernels, 1),
        ("contended", f"fleet, KERNEL_GPUS=1, {args.contended_kernels} kernels",
         args.contended_kernels, 1),
    ]  # fmt: skip
    scenarios: dict[str, Any] = {}
    for name, title, count, kernel_gpus in plan:
        if name == "local":
            progress(f"{name}: {count} kernels x {args.cells} cells")
            result = await local_scenario(root, count, args.cells, code)
        else:
            progress(
                f"{name}: a gateway and {args.hosts} host agents x {args.gpus_per_host} GPU(s), "
                f"{args.replicas} replicas per kernel; {count} kernels x {args.cells} cells"
            )
            fleet = await asyncio.to_thread(
                start_fleet,
                root / name,
                hosts=args.hosts,
                gpus=args.gpus_per_host,
                token=secrets.token_hex(16),
                replicas=args.replicas,
            )
            fleets.append(fleet)
            env = {} if kernel_gpus is None else {"KERNEL_GPUS": str(kernel_gpus)}
            try:
                result = await fleet_scenario(fleet, count, env, args.cells, code)
            finally:
                await asyncio.to_thread(fleet.stop)
        scenarios[name] = summarize(title, count, kernel_gpus or 0, result)
    local_p50 = scenarios["local"]["start_delay"]["p50_ms"]
    return {
        "machine": harness.describe_machine(),
        "parameters": {
            "hosts": args.hosts,
            "gpus_per_host": args.gpus_per_host,
            "replicas": args.replicas,
            "kernels": args.kernels,
            "contended_kernels": args.contended_kernels,
            "cells": args.cells,
            "cell": code,
            "measure": "execute_request sent -> execute_input received, client clock",
        },
        "scenarios": scenarios,
        "ratios": {
            "uncontended_p50_over_local_p50": scenarios["uncontended"]["start_delay"]["p50_ms"]
            / local_p50,
            "zero_gpu_p50_over_local_p50": scenarios["fleet-0gpu"]["start_delay"]["p50_ms"]
            / local_p50,
        },
        "queueing": queueing_model(scenarios, gpus),
    }


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Measure, and stop every process whatever happens (Ctrl-C and SIGTERM included)."""
    fleets: list[Fleet] = []
    try:
        return asyncio.run(benchmark(root, args, fleets))
    finally:
        progress("stopping every process")
        for fleet in fleets:
            fleet.stop()  # again: does nothing for a fleet already stopped


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("start_delay", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
