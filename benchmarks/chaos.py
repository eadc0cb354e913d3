"""Chaos soak: kernels run counting cells while processes die, stop and lose their network.

    python benchmarks/chaos.py [--duration 600] [--kernels 3] [--hosts 3] [--fault-interval 15]
        [--seed 0] [--faults kill-replica,kill-agent,kill-gateway,stop-replica,cut-network]
        [--stop-seconds 10] [--cut-seconds 90] [--down-seconds 10] [--heal-timeout 90]
        [--aim-at-executors] [--in-turn] [--json OUT] [--keep]

Starts a gateway and `--hosts` host agents as real processes (each agent in a network namespace
of its own when ``cut-network`` is among the faults: root needed), `--kernels` kernels of 3
replicas, and one client per kernel over the gateway's websocket. Every cell appends its number
to a list after checking the previous one; after a failed cell the next one reads the list to
learn whether it took effect. Every `--fault-interval` s (once the fleet is whole again, or after
`--heal-timeout` s) one fault picked at random (seeded by `--seed`) hits the fleet. At the end
each kernel's list is read through the gateway and from every live replica and held against what
the client was told. docs/chaos.md says what is injected and what the figures mean; the report
goes to stdout and, with `--json`, to a file. Exits 1 if a kernel was lost, a cell ran twice or
was lost silently, a failed cell had an effect, or replicas differ.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from kernelfleet.testing.chaos import Workload
from kernelfleet.testing.chaos_faults import FaultKind, Soak
from kernelfleet.testing.chaos_soak import SoakConfig, render, run_soak
from kernelfleet.testing.netns import NamespacesUnavailable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

BROKEN = (
    "lost_kernels",
    "cells_twice",
    "cells_lost_silently",
    "cells_failed_with_effect",
    "check_failures",
    "replicas_differ",
)
"""The figures that must be 0."""


def parse_faults(text: str) -> tuple[FaultKind, ...]:
    try:
        return tuple(FaultKind(name.strip()) for name in text.split(",") if name.strip())
    except ValueError as e:
        known = ",".join(kind.value for kind in FaultKind)
        raise argparse.ArgumentTypeError(f"{e}; known faults: {known}") from None


def config_from(args: argparse.Namespace) -> SoakConfig:
    return SoakConfig(
        duration=args.duration,
        kernels=args.kernels,
        hosts=args.hosts,
        seed=args.seed,
        soak=Soak(
            kinds=args.faults,
            interval=args.fault_interval,
            stop_for=args.stop_seconds,
            cut_for=args.cut_seconds,
            down=args.down_seconds,
            heal_timeout=args.heal_timeout,
            aim=args.aim_at_executors,
            in_turn=args.in_turn,
        ),
        workload=Workload(cell_timeout=args.cell_timeout, lost_after=args.lost_after),
    )


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    harness.progress("chaos", f"fleet and logs in {root}")
    root.chmod(0o711)  # kernels run as users of their own (docs/security.md) and must reach it
    report = asyncio.run(run_soak(root, config_from(args)))
    report["machine"] = harness.describe_machine()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of faults")
    parser.add_argument("--kernels", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=3, help="as `kernelfleet up` starts")
    parser.add_argument("--fault-interval", type=float, default=15, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--faults",
        type=parse_faults,
        default=tuple(FaultKind),
        help="comma-separated, of: " + ",".join(kind.value for kind in FaultKind),
    )
    parser.add_argument("--stop-seconds", type=float, default=10, help="a SIGSTOP lasts that")
    parser.add_argument("--cut-seconds", type=float, default=90, help="a network cut lasts that")
    parser.add_argument("--down-seconds", type=float, default=10, help="a killed agent stays down")
    parser.add_argument(
        "--heal-timeout", type=float, default=90, help="wait at most that for a whole fleet"
    )
    parser.add_argument(
        "--aim-at-executors",
        action="store_true",
        help="replica and host faults hit the replicas running cells (each costs a failover)",
    )
    parser.add_argument(
        "--in-turn", action="store_true", help="take the fault kinds in turn, not at random"
    )
    parser.add_argument("--cell-timeout", type=float, default=60)
    parser.add_argument(
        "--lost-after", type=float, default=180, help="a kernel with no cell run that long is lost"
    )
    harness.add_output_arguments(parser, kept="the logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[chaos] %(asctime)s %(message)s")
    reports: list[dict[str, Any]] = []

    def keep(root: Path, args: argparse.Namespace) -> dict[str, Any]:
        reports.append(run(root, args))
        return reports[-1]

    try:
        harness.run_benchmark("chaos", args, keep, render)
    except NamespacesUnavailable as e:
        harness.progress("chaos", f"cut-network needs network namespaces: {e}")
        return 2
    return 1 if any(reports[-1][name] for name in BROKEN) else 0


if __name__ == "__main__":
    sys.exit(main())
