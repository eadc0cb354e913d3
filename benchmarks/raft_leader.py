"""Does it matter whether a kernel's executor leads its Raft group? Per kernel, in one run.

    python benchmarks/raft_leader.py [--kernels 6] [--cells 60] [--warmup 5] [--json OUT] [--keep]

`--kernels` kernels of 3 replicas on one fleet with the stage log on (see ``cell_stages.py``),
all open at once. `--cells` trivial cells per kernel are sent directly to the gateway, one kernel
after the other round-robin, so load drifts over all kernels alike. Each kernel's row gives
whether the replica that ran its cells was its group's Raft leader (each replica's own view),
then the p50 of its two Raft commits and of its round trip. Which replica leads was Raft's
election and which one executes the gateway's policy, independently, until the executor asked
for the leadership after its cells (kernels/replica/leadership.py): every row now says it leads.
Run it from a checkout before that change to see both kinds side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
from pathlib import Path
from typing import Any

from kernelfleet.testing import Fleet, KernelWebsocket, start_fleet

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import cell_roundtrip as rt  # noqa: E402
import cell_stages as cs  # noqa: E402
import harness  # noqa: E402

FIGURES = {
    "lead_commit_ms": ("request_in", "lead_committed"),
    "delta_commit_ms": ("delta_encoded", "delta_committed"),
    "round_trip_ms": ("client_sent", "client_idle"),
}


async def measure(fleet: Fleet, kernels: int, cells: int, warmup: int) -> list[dict[str, Any]]:
    """Each kernel's cells (client stamps) and Raft roles."""
    gateway = rt.Endpoint(rt.configurations(fleet.url, fleet.token)[-1], fleet.url, fleet.token)
    opened: dict[str, KernelWebsocket] = {}
    try:
        for _ in range(kernels):
            kernel_id = (await rt.call(gateway, "POST", "/api/kernels", {"name": "python3"}))["id"]
            opened[kernel_id] = await rt.open_channels(gateway, kernel_id)
            for _ in range(warmup):
                await cs.timed_cell(opened[kernel_id])
        timed: dict[str, list[dict[str, Any]]] = {kernel_id: [] for kernel_id in opened}
        for i in range(cells):
            for kernel_id in rt.rotated(list(opened), i):
                timed[kernel_id].append(await cs.timed_cell(opened[kernel_id]))
        return [
            {"cells": timed[k], "raft": await cs.raft_roles(fleet, k, timed[k][-1]["msg_id"])}
            for k in opened
        ]
    finally:
        for kernel_id, kernel in opened.items():
            kernel.close()
            await rt.call(gateway, "DELETE", f"/api/kernels/{kernel_id}")


def summarize(runs: list[dict[str, Any]], log: Path) -> list[dict[str, Any]]:
    logged = cs.read_stage_log(log)
    rows = []
    for run in runs:
        stamps = [{**logged[c["msg_id"]], **c} for c in run["cells"]]
        row: dict[str, Any] = {"executor_is_raft_leader": run["raft"]["executor_is_raft_leader"]}
        for name, (start, end) in FIGURES.items():
            row[name] = statistics.median((s[end] - s[start]) * 1000 for s in stamps)
        rows.append(row)
    return rows


def render(report: dict[str, Any]) -> str:
    lines = [f"{'executor leads Raft':<20}" + "".join(f"{n + ' p50':>22}" for n in FIGURES)]
    for row in report["kernels"]:
        lines.append(
            f"{'yes' if row['executor_is_raft_leader'] else 'no':<20}"
            + "".join(f"{row[n]:>22.2f}" for n in FIGURES)
        )
    for leads in (True, False):
        group = [r for r in report["kernels"] if r["executor_is_raft_leader"] is leads]
        if group:
            medians = "".join(f"{statistics.median(r[n] for r in group):>22.2f}" for n in FIGURES)
            lines.append(f"{'median, ' + ('leader' if leads else 'follower'):<20}{medians}")
    return "\n".join(lines)


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    log = root / "stages.log"
    harness.progress("raft_leader", f"{args.kernels} kernels, {args.cells} cells each")
    fleet = start_fleet(
        root / "fleet", hosts=3, gpus=2, token=secrets.token_hex(16), replicas=3,
        env={cs.STAGE_LOG_ENV: str(log)},
    )  # fmt: skip
    try:
        runs = asyncio.run(measure(fleet, args.kernels, args.cells, args.warmup))
    finally:
        fleet.stop()
    return {
        "machine": harness.describe_machine(),
        "parameters": {"kernels": args.kernels, "cells": args.cells, "warmup": args.warmup},
        "kernels": summarize(runs, log),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", type=int, default=6)
    parser.add_argument("--cells", type=int, default=60, help="timed cells per kernel")
    parser.add_argument("--warmup", type=int, default=5, help="untimed cells first, per kernel")
    harness.add_output_arguments(parser, kept="logs")
    return harness.run_benchmark("raft_leader", parser.parse_args(argv), run, render)


if __name__ == "__main__":
    sys.exit(main())
