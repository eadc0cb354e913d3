"""kernelfleet against a local kernel, as a user meets both, in one run.

    python benchmarks/vs_local.py [--cells 200] [--warmup 10] [--starts 5] [--notebook-runs 2]
        [--replicas 3] [--pool 1] [--json OUT] [--keep] [--quick]

Two real ``jupyter server`` subprocesses, the same flags but one (``cell_roundtrip.py``'s
configurations B and D):

  local        jupyter_server's own kernel manager, TCP_NODELAY on its kernel websocket
  kernelfleet  ``--gateway-url`` to a fleet (gateway + 3 host agents, ``--replicas`` replicas a
               kernel, a warm pool of ``--pool`` groups) with the kernelfleet extension
               (TCP_NODELAY on, the same call)

With ``--pool`` > 0, kernel starts and shutdowns are also timed on a third server
(``kernelfleet_cold``) whose fleet runs no pool, in the same rounds: the pool's gain, measured
against cold starts under the same load. Before each start (of every side) the script waits
until the pool is full again, so that its refill overlaps no timed start (a start that finds the
pool empty is a cold one: the third side times those), and it counts the starts the gateway
served from the pool.

One client path for all. Measured, each pair interleaved so background load falls on both:

- a trivial cell's round trip (``x = 1`` to its reply and idle), p50 / p99;
- kernel start (``POST /api/kernels`` to the first cell's result), restart (``POST
  .../restart`` to the next cell's result) and shutdown (``DELETE``);
- the notebooks of ``benchmarks/notebooks/`` end to end through nbclient: start, cells, shutdown;
- the memory of an idle kernel: PSS / RSS of its processes (one ipykernel; the replicas).

Ratios are kernelfleet / local. ``--quick`` (a few cells, one start, one notebook run) is what
the test suite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kernelfleet.testing import Fleet, percentile, start_fleet

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import cell_roundtrip as rt  # noqa: E402
import harness  # noqa: E402
import kernel_memory  # noqa: E402
import notebook_timing  # noqa: E402

NOTEBOOKS = BENCH_DIR / "notebooks"
SIDES = {"B": "local", "D": "kernelfleet", "F": "kernelfleet_cold"}
"""cell_roundtrip's configuration -> name here; F: D pointed at a fleet without a pool."""
POOL_REFILL_WAIT_S = 60.0
IDLE_SETTLE_S = 1.0  # after the last cell, before memory is read


def progress(message: str) -> None:
    harness.progress("vs_local", message)


# ---- measurements ------------------------------------------------------------------------------


async def first_result(endpoint: rt.Endpoint, kernel_id: str) -> None:
    """Open the kernel's channels and run one cell to its result."""
    kernel = await rt.open_channels(endpoint, kernel_id)
    try:
        await rt.run_cell(kernel)
    finally:
        kernel.close()


async def start_restart_shutdown(endpoint: rt.Endpoint) -> tuple[float, float, float]:
    """Seconds from ``POST /api/kernels`` to the first cell's result, from ``POST
    .../restart`` to the next cell's result, and for its ``DELETE``."""
    started = time.perf_counter()
    kernel_id = (await rt.call(endpoint, "POST", "/api/kernels", {"name": rt.KERNEL_NAME}))["id"]
    try:
        await first_result(endpoint, kernel_id)
        start = time.perf_counter() - started
        restarting = time.perf_counter()
        await rt.call(endpoint, "POST", f"/api/kernels/{kernel_id}/restart", {})
        await first_result(endpoint, kernel_id)
        restart = time.perf_counter() - restarting
    finally:
        stopping = time.perf_counter()
        await rt.call(endpoint, "DELETE", f"/api/kernels/{kernel_id}")
    return start, restart, time.perf_counter() - stopping


async def measure_starts(
    endpoints: list[rt.Endpoint], samples: int, pooled: Fleet | None, pool: int = 0
) -> dict[str, Any]:
    """Interleaved starts and shutdowns. Before each start (of any side), `pooled`'s pool of
    `pool` groups is full again: its refill, in the background after a start took a group,
    then overlaps none of the other sides' starts."""
    starts: dict[str, list[float]] = {SIDES[e.config.key]: [] for e in endpoints}
    restarts: dict[str, list[float]] = {SIDES[e.config.key]: [] for e in endpoints}
    stops: dict[str, list[float]] = {SIDES[e.config.key]: [] for e in endpoints}
    for i in range(samples):
        for endpoint in rt.rotated(endpoints, i):
            if pooled is not None:
                await asyncio.to_thread(wait_pool_full, pooled, pool)
            start, restart, stop = await start_restart_shutdown(endpoint)
            starts[SIDES[endpoint.config.key]].append(start)
            restarts[SIDES[endpoint.config.key]].append(restart)
            stops[SIDES[endpoint.config.key]].append(stop)
        progress(f"kernel start, restart and shutdown: {i + 1}/{samples} rounds")
    return {"kernel_start_s": starts, "restart_s": restarts, "shutdown_s": stops}


def gateway_metric(fleet: Fleet, sample: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    for line in fleet.request_text("GET", "/metrics").splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return 0.0


def wait_pool_full(fleet: Fleet, size: int) -> None:
    deadline = time.monotonic() + POOL_REFILL_WAIT_S
    while gateway_metric(fleet, "kernelfleet_kernel_pool_ready") < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not refill to {size} in {POOL_REFILL_WAIT_S:.0f} s")
        time.sleep(0.1)


def idle_memory(
    fleet: Fleet, servers: dict[str, rt.Endpoint], kernel_ids: dict[str, str]
) -> dict[str, Any]:
    """PSS / RSS of each side's idle kernel, and what a replica costs beyond a plain ipykernel."""
    local_server = servers["B"].process
    assert local_server is not None
    local = kernel_memory.memory_of(kernel_memory.local_kernel_pids(local_server.pid))
    agents = [process.pid for process in fleet.hosts.values()]
    replicas = kernel_memory.memory_of(kernel_memory.replica_pids(agents, kernel_ids["D"]))
    per_replica = {f"{k}_per_process": replicas[k] / replicas["processes"] for k in SIZES}
    return {
        "local": local,
        "kernelfleet": {**replicas, **per_replica},
        "replica_beyond_plain": {
            k: replicas[k] / replicas["processes"] - local[k] / local["processes"] for k in SIZES
        },
        "ratio": {k: replicas[k] / local[k] for k in SIZES},
    }


SIZES = ("pss_mib", "rss_mib")


async def measure_cells_and_memory(
    fleet: Fleet, endpoints: list[rt.Endpoint], cells: int, warmup: int
) -> dict[str, Any]:
    memory: dict[str, Any] = {}

    async def read_memory(kernel_ids: dict[str, str]) -> None:
        await asyncio.sleep(IDLE_SETTLE_S)
        memory.update(idle_memory(fleet, {e.config.key: e for e in endpoints}, kernel_ids))

    times = await rt.measure_cells(endpoints, cells, warmup, before_shutdown=read_memory)
    roundtrip = {}
    for key, seconds in times.items():
        ms = [t * 1000 for t in seconds]
        roundtrip[SIDES[key]] = {
            "p50": statistics.median(ms), "p99": percentile(ms, 99),
            "mean": statistics.fmean(ms), "n": len(ms),
        }  # fmt: skip
    return {"roundtrip_ms": roundtrip, "memory": memory}


async def measure_notebooks(
    endpoints: list[rt.Endpoint], notebooks: list[Path], runs: int
) -> dict[str, Any]:
    """Each notebook `runs` times on each side, interleaved; the median of each phase."""
    results: dict[str, Any] = {}
    for path in notebooks:
        samples: dict[str, list[dict[str, Any]]] = {SIDES[e.config.key]: [] for e in endpoints}
        for i in range(runs):
            for endpoint in rt.rotated(endpoints, i):
                run = await notebook_timing.run_notebook(path, endpoint.url, endpoint.token)
                samples[SIDES[endpoint.config.key]].append(run)
            progress(f"notebook {path.name}: {i + 1}/{runs} rounds")
        medians = {
            side: {p: statistics.median(r[p] for r in runs_) for p in notebook_timing.PHASES}
            for side, runs_ in samples.items()
        }
        results[path.stem] = {
            "code_cells": samples["local"][0]["code_cells"],
            "slowest_cells": slowest_cells(samples),
            **medians,
            "ratio": {
                p: medians["kernelfleet"][p] / medians["local"][p] for p in notebook_timing.PHASES
            },
        }
    return results


def slowest_cells(samples: dict[str, list[dict[str, Any]]], top: int = 3) -> list[Any]:
    """The `top` code cells kernelfleet adds most time to (median of runs, per side): where a
    notebook's ratio comes from."""
    medians = {
        side: [statistics.median(cells) for cells in zip(*(r["cell_s"] for r in runs), strict=True)]
        for side, runs in samples.items()
    }
    cells = [
        {"code_cell": i + 1, "local_s": local, "kernelfleet_s": fleet}
        for i, (local, fleet) in enumerate(
            zip(medians["local"], medians["kernelfleet"], strict=True)
        )
    ]
    return sorted(cells, key=lambda c: c["local_s"] - c["kernelfleet_s"])[:top]


async def benchmark(fleet: Fleet, endpoints: list[rt.Endpoint], args: argparse.Namespace) -> Any:
    load_before = os.getloadavg()[0]
    progress(f"timing {args.starts} kernel starts, restarts and shutdowns per side")
    pooled = fleet if args.pool > 0 else None
    pool_starts = gateway_metric(fleet, 'kernelfleet_kernel_starts_total{source="pool"}')
    starts = await measure_starts(endpoints, args.starts, pooled, args.pool)
    pool_starts = (
        gateway_metric(fleet, 'kernelfleet_kernel_starts_total{source="pool"}') - pool_starts
    )
    endpoints = [e for e in endpoints if e.config.key != "F"]  # the rest compares two sides
    progress(f"timing {args.cells} cells per side after {args.warmup} warm-up cells")
    cells = await measure_cells_and_memory(fleet, endpoints, args.cells, args.warmup)
    notebooks = args.notebooks
    progress(f"running {', '.join(p.name for p in notebooks)} {args.notebook_runs}x per side")
    runs = await measure_notebooks(endpoints, notebooks, args.notebook_runs)
    for endpoint in endpoints:
        rt.check_server_log(endpoint)
    report = summarize(starts, cells, runs, args, (load_before, os.getloadavg()[0]))
    report["pool"] = {"starts_served": int(pool_starts)}
    return report


# ---- results -----------------------------------------------------------------------------------


def summarize(
    starts: dict[str, Any],
    cells: dict[str, Any],
    notebooks: dict[str, Any],
    args: argparse.Namespace,
    load: tuple[float, float],
) -> dict[str, Any]:
    lifecycle = {
        name: {
            side: {"median": statistics.median(samples), "samples": samples}
            for side, samples in by_side.items()
        }
        for name, by_side in starts.items()
    }
    roundtrip = cells["roundtrip_ms"]

    def over(figures: dict[str, Any], stat: str) -> float:
        return float(figures["kernelfleet"][stat] / figures["local"][stat])

    def cold(figures: dict[str, Any]) -> float:
        return float(figures["kernelfleet_cold"]["median"] / figures["local"]["median"])

    return {
        "machine": harness.describe_machine(),
        "load_average_1min": {"before": load[0], "after": load[1]},
        "parameters": {
            "cells": args.cells,
            "warmup": args.warmup,
            "kernel_starts": args.starts,
            "notebook_runs": args.notebook_runs,
            "replicas": args.replicas,
            "pool": args.pool,
            "notebooks": [p.name for p in args.notebooks],
            "cell": rt.CELL,
        },
        "roundtrip_ms": roundtrip,
        **lifecycle,
        "notebooks": notebooks,
        "memory": cells["memory"],
        "ratios": {
            "roundtrip_p50": over(roundtrip, "p50"),
            "roundtrip_p99": over(roundtrip, "p99"),
            "kernel_start": over(lifecycle["kernel_start_s"], "median"),
            "restart": over(lifecycle["restart_s"], "median"),
            "shutdown": over(lifecycle["shutdown_s"], "median"),
            **(
                {
                    "kernel_start_cold": cold(lifecycle["kernel_start_s"]),
                    "shutdown_cold": cold(lifecycle["shutdown_s"]),
                }
                if "kernelfleet_cold" in lifecycle["kernel_start_s"]
                else {}
            ),
            **{f"notebook_{name}_total": nb["ratio"]["total_s"] for name, nb in notebooks.items()},
            **{f"notebook_{name}_cells": nb["ratio"]["cells_s"] for name, nb in notebooks.items()},
            "idle_kernel_pss": cells["memory"]["ratio"]["pss_mib"],
        },
    }


def render(report: dict[str, Any]) -> str:
    m, p, load = report["machine"], report["parameters"], report["load_average_1min"]
    rt_, ratios = report["roundtrip_ms"], report["ratios"]
    local, fleet = "local", "kernelfleet"
    lines = [
        f"{m['cpus']} CPUs, Python {m['python']}, jupyter_server {m['jupyter_server']}, "
        f"ipykernel {m['ipykernel']}; {p['replicas']} replicas a kernelfleet kernel, a warm pool "
        f"of {p['pool']}; load "
        f"{load['before']:.1f} -> {load['after']:.1f}",
        "",
        f"{'':<44} {local:>12} {fleet:>12} {'ratio':>8}",
    ]

    def row(label: str, a: float, b: float, unit: str, ratio: float) -> None:
        lines.append(f"{label:<44} {a:>9.2f} {unit:<2} {b:>9.2f} {unit:<2} {ratio:>7.2f}x")

    n = rt_[local]["n"]
    row(f"cell round trip p50 ({n} cells)", rt_[local]["p50"], rt_[fleet]["p50"], "ms",
        ratios["roundtrip_p50"])  # fmt: skip
    row("cell round trip p99", rt_[local]["p99"], rt_[fleet]["p99"], "ms", ratios["roundtrip_p99"])
    for name, label in (("kernel_start_s", "kernel start to first result"),
                        ("restart_s", "kernel restart to first result"),
                        ("shutdown_s", "kernel shutdown")):  # fmt: skip
        figures = report[name]
        k = len(figures[local]["samples"])
        row(f"{label} (median of {k})", figures[local]["median"], figures[fleet]["median"], "s",
            figures[fleet]["median"] / figures[local]["median"])  # fmt: skip
        if "kernelfleet_cold" in figures:
            row("  the same without the pool", figures[local]["median"],
                figures["kernelfleet_cold"]["median"], "s",
                figures["kernelfleet_cold"]["median"] / figures[local]["median"])  # fmt: skip
    if p["pool"]:
        lines.append(f"kernelfleet starts served from the pool: {report['pool']['starts_served']}")
    for name, nb in report["notebooks"].items():
        lines.append(f"notebook {name} ({nb['code_cells']} code cells, median of runs):")
        for phase in notebook_timing.PHASES:
            row(f"  {phase[:-2]}", nb[local][phase], nb[fleet][phase], "s", nb["ratio"][phase])
        for cell in nb["slowest_cells"]:
            row(f"    code cell {cell['code_cell']} (most added)", cell["local_s"],
                cell["kernelfleet_s"], "s", cell["kernelfleet_s"] / cell["local_s"])  # fmt: skip
    mem = report["memory"]
    lines.append(
        f"idle kernel memory: local {mem['local']['processes']} process, kernelfleet "
        f"{mem['kernelfleet']['processes']} replica processes"
    )
    for size in SIZES:
        row(f"  {size[:3].upper()} (MiB)", mem["local"][size], mem["kernelfleet"][size], "",
            mem["ratio"][size])  # fmt: skip
    beyond = mem["replica_beyond_plain"]
    lines.append(
        f"  one replica beyond a plain ipykernel: PSS {beyond['pss_mib']:+.1f} MiB, "
        f"RSS {beyond['rss_mib']:+.1f} MiB"
    )
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=200, help="timed cells per side")
    parser.add_argument("--warmup", type=int, default=10, help="untimed cells first, per kernel")
    parser.add_argument("--starts", type=int, default=5, help="kernel starts per side")
    parser.add_argument("--notebook-runs", type=int, default=2, help="runs per notebook and side")
    parser.add_argument("--replicas", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument(
        "--pool", type=int, default=1,
        help="the fleet's warm pool (GatewayApp.kernel_pool_size); > 0 also times cold starts "
        "on a second fleet without one",
    )  # fmt: skip
    harness.add_output_arguments(parser, kept="server logs")
    parser.add_argument(
        "--quick", action="store_true",
        help="5 cells, 1 start, the pandas notebook once: for the test suite",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.quick:
        args.cells, args.warmup, args.starts, args.notebook_runs = 5, 1, 1, 1
        args.notebooks = [NOTEBOOKS / "pandas_sales.ipynb"]
    if min(args.cells, args.starts, args.notebook_runs) < 1 or min(args.warmup, args.pool) < 0:
        parser.error(
            "--cells, --starts and --notebook-runs must be at least 1, --warmup and --pool >= 0"
        )
    return args


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleets and the servers, measure, and stop every process whatever happens."""
    fleets: list[Fleet] = []
    servers: list[rt.Endpoint] = []
    try:
        progress(
            f"starting a fleet: gateway, 3 host agents, {args.replicas} replicas a kernel, "
            f"a warm pool of {args.pool}"
        )
        fleet = start_pool_fleet(root / "fleet", args.replicas, args.pool)
        fleets.append(fleet)
        configs = [c for c in rt.configurations(fleet.url, fleet.token) if c.key in SIDES]
        if args.pool > 0:
            progress("starting a second fleet without a pool, for cold starts")
            cold = start_pool_fleet(root / "fleet-cold", args.replicas, 0)
            fleets.append(cold)
            (d,) = (c for c in rt.configurations(cold.url, cold.token) if c.key == "D")
            configs.append(dataclasses.replace(d, key="F", title=f"{d.title}, no pool"))
        token = secrets.token_hex(16)
        progress(f"starting {len(configs)} jupyter_server subprocesses")
        servers = [rt.launch_server(config, root, token) for config in configs]
        for server in servers:
            rt.wait_until_serving(server)
        return asyncio.run(benchmark(fleet, servers, args))
    finally:
        progress("stopping every process")
        for server in servers:
            rt.stop_server(server)
        for each in fleets:
            each.stop()


def start_pool_fleet(state_dir: Path, replicas: int, pool: int) -> Fleet:
    """A gateway and 3 host agents of 2 virtual GPUs, with a warm pool of `pool` groups."""
    return start_fleet(
        state_dir, hosts=3, gpus=2, token=secrets.token_hex(16), replicas=replicas,
        gateway_args=(f"--GatewayApp.kernel_pool_size={pool}",),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return harness.run_benchmark("vs_local", parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
