"""Where a trivial cell's time goes on a replicated kernel: a per-stage breakdown.

    python benchmarks/cell_stages.py [--cells 200] [--warmup 10] [--replicas 3] [--json OUT]
        [--notebook benchmarks/notebooks/pandas_sales.ipynb] [--keep]

A fleet (gateway + 3 host agents, ``--replicas`` replicas a kernel) started with
``KERNELFLEET_STAGE_LOG`` set: the gateway and each executor replica then append
``<time.monotonic()> <process> <cell id> <stage>`` lines at fixed points of a cell's path (see
`STAGES`). The client stamps the same clock (CLOCK_MONOTONIC, one per machine) when it sends a
cell and when its reply and idle status arrive. Two client paths, cells interleaved:

  D  through ``jupyter server --gateway-url`` with the kernelfleet extension (what users meet)
  E  to the gateway's websocket directly

Each interval between consecutive stamps is a stage; they add up to the round trip. The YIELD
fan-out (the gateway sending the cell to the other replicas after the executor) runs beside the
chain, so it is reported apart. With ``--notebook``, the notebook's code cells then run in order
on a kernel of their own (E), each broken into `NOTEBOOK_STAGES`: where real cells spend what
kernelfleet adds.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import nbformat

from kernelfleet.stage_log import ENV as STAGE_LOG_ENV
from kernelfleet.testing import Fleet, KernelWebsocket, percentile, start_fleet
from kernelfleet.testing.replicas import replica_status

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import cell_roundtrip as rt  # noqa: E402
import harness  # noqa: E402

# (from stamp, to stamp, stage): consecutive along a cell's critical path.
STAGES = (
    ("client_sent", "received", "client -> gateway (relay in)"),
    ("received", "dequeued", "gateway: cell queue"),
    ("dequeued", "assigned", "gateway: policy + ledger (assign)"),
    ("assigned", "lead_sent", "gateway: LEAD message to the executor"),
    ("lead_sent", "request_in", "zmq -> executor, ipykernel dispatch"),
    ("request_in", "lead_committed", "executor: LEAD commit (Raft)"),
    ("lead_committed", "owed_deltas_in", "executor: wait for owed deltas"),
    ("owed_deltas_in", "ran", "executor: execution (ipykernel)"),
    ("ran", "delta_encoded", "executor: namespace diff + encode (state sync)"),
    ("delta_encoded", "delta_committed", "executor: state delta commit (Raft)"),
    ("delta_committed", "reply_sent", "executor: reply sent (ipykernel)"),
    ("reply_sent", "execute_reply_in", "zmq -> gateway, reply verified"),
    ("execute_reply_in", "client_reply", "gateway -> client (relay out)"),
    ("client_reply", "client_idle", "reply -> idle status at client"),
)
# A notebook cell's stages, coarser: where real cells spend what kernelfleet adds.
NOTEBOOK_STAGES = (
    ("client_sent", "request_in", "to the executor"),
    ("request_in", "lead_committed", "LEAD commit"),
    ("owed_deltas_in", "ran", "execution"),
    ("ran", "delta_encoded", "namespace diff + encode"),
    ("delta_encoded", "delta_committed", "delta commit"),
    ("delta_committed", "client_idle", "reply to the client"),
)
BESIDE = (("lead_sent", "yields_sent", "gateway: YIELD to the other replicas (beside the chain)"),)


def progress(message: str) -> None:
    harness.progress("cell_stages", message)


async def timed_cell(kernel: KernelWebsocket, code: str = rt.CELL) -> dict[str, Any]:
    """Send `code`; the client's stamps of sending it and of its reply and idle arriving."""
    sent = time.monotonic()
    msg_id = kernel.send("execute_request", {"code": code, "silent": False})
    stamps = {"client_sent": sent}
    while len(stamps) < 3:
        msg = await kernel.receive(timeout=60)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "execute_reply":
            if msg["content"]["status"] != "ok":
                raise RuntimeError(f"the cell failed: {msg['content']}")
            stamps["client_reply"] = time.monotonic()
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            stamps["client_idle"] = time.monotonic()
    return {"msg_id": msg_id, **stamps}


async def raft_roles(fleet: Fleet, kernel_id: str, cell_id: str) -> dict[str, Any]:
    """Which replica ran `cell_id` and which leads the kernel's Raft group (each replica's own
    view, asked on its control channel). A LEAD or delta appended by a follower goes through the
    leader, so it costs more than one appended by the leader itself; an executor asks for the
    leadership after its cells, so the replicas are asked again (up to 10 s) while an election
    leaves them without one leader."""
    deadline = time.monotonic() + 10
    while True:
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        statuses = [await replica_status(fleet, replica) for replica in model["replicas"]]
        leaders = {s["replica_id"] for s in statuses if s.get("raft", {}).get("is_leader")}
        if len(leaders) == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    executors = {r for s in statuses for c, _, r in s.get("executors", []) if c == cell_id}
    return {
        "executor": sorted(executors),
        "raft_leader": sorted(leaders),
        "executor_is_raft_leader": executors == leaders and len(leaders) == 1,
    }


async def measure(
    fleet: Fleet, endpoints: list[rt.Endpoint], cells: int, warmup: int
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """One kernel per endpoint, `warmup` cells each, then `cells` timed ones interleaved; the
    client's stamps of each cell, and each kernel's `raft_roles` after its last cell."""
    started: list[tuple[rt.Endpoint, str]] = []
    kernels: dict[str, KernelWebsocket] = {}
    try:
        for endpoint in endpoints:
            kernel_id = (await rt.call(endpoint, "POST", "/api/kernels", {"name": "python3"}))["id"]
            started.append((endpoint, kernel_id))
            kernels[endpoint.config.key] = await rt.open_channels(endpoint, kernel_id)
        for kernel in kernels.values():
            for _ in range(warmup):
                await timed_cell(kernel)
        timed: dict[str, list[Any]] = {key: [] for key in kernels}
        for i in range(cells):
            for key in rt.rotated(list(kernels), i):
                timed[key].append(await timed_cell(kernels[key]))
            if (i + 1) % 50 == 0 or i + 1 == cells:
                progress(f"cells: {i + 1}/{cells} rounds")
        roles = {
            endpoint.config.key: await raft_roles(
                fleet, kernel_id, timed[endpoint.config.key][-1]["msg_id"]
            )
            for endpoint, kernel_id in started
        }
        return timed, roles
    finally:
        for kernel in kernels.values():
            kernel.close()
        for endpoint, kernel_id in started:
            await rt.call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")


async def notebook_cells(endpoint: rt.Endpoint, path: Path) -> list[dict[str, Any]]:
    """Run the code cells of the notebook at `path` in order on a new kernel; their stamps."""
    codes = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    kernel_id = (await rt.call(endpoint, "POST", "/api/kernels", {"name": "python3"}))["id"]
    try:
        kernel = await rt.open_channels(endpoint, kernel_id)
        try:
            return [await timed_cell(kernel, code) for code in codes]
        finally:
            kernel.close()
    finally:
        await rt.call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")


def per_cell(cells: list[dict[str, Any]], logged: dict[str, dict[str, float]]) -> list[Any]:
    """Each notebook cell's round trip and `NOTEBOOK_STAGES`, in ms."""
    rows = []
    for cell in cells:
        stamps = {**logged.get(cell["msg_id"], {}), **cell}
        stages = {name: (stamps[b] - stamps[a]) * 1000 for a, b, name in NOTEBOOK_STAGES}
        total = (stamps["client_idle"] - stamps["client_sent"]) * 1000
        rows.append({"round_trip_ms": total, "stages_ms": stages})
    return rows


def read_stage_log(path: Path) -> dict[str, dict[str, float]]:
    """cell id -> stage -> time, from the processes' stage log (the first stamp of a stage)."""
    stamps: dict[str, dict[str, float]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        when, _process, cell_id, stage = line.split()
        stamps[cell_id].setdefault(stage, float(when))
    return stamps


def breakdown(cells: list[dict[str, Any]], logged: dict[str, dict[str, float]]) -> dict[str, Any]:
    """p50 / p99 / mean of each stage over `cells` (ms), and of the whole round trip."""
    per_stage: dict[str, list[float]] = {name: [] for *_, name in (*STAGES, *BESIDE)}
    totals = []
    for cell in cells:
        stamps = {**logged.get(cell["msg_id"], {}), **cell}
        missing = {s for a, b, _ in (*STAGES, *BESIDE) for s in (a, b)} - set(stamps)
        if missing:
            raise RuntimeError(f"cell {cell['msg_id']}: no stamp for {sorted(missing)}")
        for start, end, name in (*STAGES, *BESIDE):
            per_stage[name].append((stamps[end] - stamps[start]) * 1000)
        totals.append((stamps["client_idle"] - stamps["client_sent"]) * 1000)

    def figures(ms: list[float]) -> dict[str, float]:
        return {
            "p50": statistics.median(ms),
            "p99": percentile(ms, 99),
            "mean": statistics.fmean(ms),
        }

    return {
        "n": len(cells),
        "stages_ms": {name: figures(ms) for name, ms in per_stage.items()},
        "round_trip_ms": figures(totals),
    }


async def benchmark(
    fleet: Fleet, endpoints: list[rt.Endpoint], log: Path, args: argparse.Namespace
) -> Any:
    progress(f"timing {args.cells} cells per path after {args.warmup} warm-up cells")
    timed, roles = await measure(fleet, endpoints, args.cells, args.warmup)
    notebook: list[dict[str, Any]] = []
    if args.notebook is not None:
        progress(f"running {args.notebook.name}'s code cells on the gateway directly (E)")
        notebook = await notebook_cells(endpoints[-1], args.notebook)
    logged = read_stage_log(log)
    titles = {"D": "through jupyter_server + extension", "E": "gateway directly"}
    report = {
        "machine": harness.describe_machine(),
        "parameters": {
            "cells": args.cells,
            "warmup": args.warmup,
            "replicas": args.replicas,
            "notebook": None if args.notebook is None else args.notebook.name,
        },
        "paths": {
            key: {"title": titles[key], "raft": roles[key], **breakdown(cells, logged)}
            for key, cells in timed.items()
        },
    }
    if notebook:
        report["notebook_cells"] = per_cell(notebook, logged)
    return report


def render(report: dict[str, Any]) -> str:
    paths = report["paths"]
    keys = list(paths)
    head = "".join(f"{key + ' p50':>10}{key + ' p99':>10}" for key in keys)
    lines = [
        f"{report['parameters']['cells']} cells 'x = 1' a path, "
        f"{report['parameters']['replicas']} replicas; "
        + "; ".join(f"{k}: {paths[k]['title']}" for k in keys),
        "",
        f"{'stage (ms)':<58}{head}",
    ]
    for *_, name in (*STAGES, *BESIDE):
        row = "".join(
            f"{paths[k]['stages_ms'][name]['p50']:>10.2f}{paths[k]['stages_ms'][name]['p99']:>10.2f}"
            for k in keys
        )
        lines.append(f"{name:<58}{row}")
    row = "".join(
        f"{paths[k]['round_trip_ms']['p50']:>10.2f}{paths[k]['round_trip_ms']['p99']:>10.2f}"
        for k in keys
    )
    lines.append(f"{'round trip (client sent -> idle)':<58}{row}")
    sums = "".join(
        f"{sum(paths[k]['stages_ms'][n]['p50'] for *_, n in STAGES):>10.2f}{'':>10}" for k in keys
    )
    lines.append(f"{'sum of the stage p50s (chain only)':<58}{sums}")
    for key in keys:
        raft = paths[key]["raft"]
        lines.append(
            f"{key}: the executor {'is' if raft['executor_is_raft_leader'] else 'is not'} its "
            f"group's Raft leader (executor {raft['executor']}, leader {raft['raft_leader']})"
        )
    if "notebook_cells" in report:
        lines += ["", f"{report['parameters']['notebook']}, code cells on E (ms):"]
        names = [name for *_, name in NOTEBOOK_STAGES]
        lines.append(f"{'cell':>4} {'round trip':>10}" + "".join(f"{n:>24}" for n in names))
        for i, cell in enumerate(report["notebook_cells"], 1):
            stages = "".join(f"{cell['stages_ms'][n]:>24.1f}" for n in names)
            lines.append(f"{i:>4} {cell['round_trip_ms']:>10.1f}{stages}")
        sums = "".join(
            f"{sum(c['stages_ms'][n] for c in report['notebook_cells']):>24.1f}" for n in names
        )
        total = sum(c["round_trip_ms"] for c in report["notebook_cells"])
        lines.append(f"{'sum':>4} {total:>10.1f}{sums}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=200, help="timed cells per path")
    parser.add_argument("--warmup", type=int, default=10, help="untimed cells first, per kernel")
    parser.add_argument("--replicas", type=int, default=3, choices=[2, 3])
    harness.add_output_arguments(parser, kept="logs")
    parser.add_argument(
        "--notebook", type=Path,
        help="also run this notebook's code cells (gateway directly) and break each cell down",
    )  # fmt: skip
    return parser.parse_args(argv)


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    fleet: Fleet | None = None
    server: rt.Endpoint | None = None
    log = root / "stages.log"
    try:
        progress(f"starting a fleet with stage stamps on, {args.replicas} replicas a kernel")
        fleet = start_fleet(
            root / "fleet",
            hosts=3,
            gpus=2,
            token=secrets.token_hex(16),
            replicas=args.replicas,
            env={STAGE_LOG_ENV: str(log)},
        )
        configs = {c.key: c for c in rt.configurations(fleet.url, fleet.token)}
        server = rt.launch_server(configs["D"], root, secrets.token_hex(16))
        rt.wait_until_serving(server)
        direct = rt.Endpoint(configs["E"], fleet.url, fleet.token)
        return asyncio.run(benchmark(fleet, [server, direct], log, args))
    finally:
        progress("stopping every process")
        if server is not None:
            rt.stop_server(server)
        if fleet is not None:
            fleet.stop()


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("cell_stages", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
