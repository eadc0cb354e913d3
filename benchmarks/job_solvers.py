"""Solve time per scheduling round of the job policies, against the number of jobs.

    python benchmarks/job_solvers.py [--jobs 10,50,100,200,400] [--repeats 3] [--gpus 32]
                                     [--policy shockwave ...] [--timeout 15] [--json OUT]

Each repeat builds a synthetic queue (seeded) shaped like Shockwave's TACC trace: jobs of 1, 2 or 4
GPUs (60 / 30 / 10 %), 0.5 to 8 hours of work, arrived over the last hour and part done, on a
homogeneous cluster, 120 s rounds. A fresh policy then allocates once, so every figure is a full
solve: cvxpy's model building and HiGHS's solve, wall time. The figures are printed as a table
(median and worst over the repeats, and how the solve went), never asserted.

To add a policy, add a factory to `POLICIES` (name -> options -> JobPolicy); a policy exposing
``last_solve`` (Shockwave's `SolveReport`) also gets its relaxed / time-limit columns.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kernelfleet.scheduler.jobs import gavel
from kernelfleet.scheduler.jobs.model import JobsSnapshot, JobView
from kernelfleet.scheduler.jobs.policy import JobPolicy, SolverFailed
from kernelfleet.scheduler.jobs.shockwave import ShockwavePolicy

ROUND_S = 120.0
NOW_S = 3600.0

POLICIES: dict[str, Callable[[argparse.Namespace], JobPolicy]] = {
    "shockwave": lambda args: ShockwavePolicy(solver_timeout=args.timeout),
    "max_min_fairness_perf": lambda args: gavel.MaxMinFairnessPerfPolicy(),
    "finish_time_fairness_perf": lambda args: gavel.FinishTimeFairnessPerfPolicy(),
    "min_total_duration_perf": lambda args: gavel.MinTotalDurationPerfPolicy(),
}


def synthetic_queue(jobs: int, gpus: int, seed: int) -> JobsSnapshot:
    rng = random.Random(seed)
    views = []
    for index in range(jobs):
        rate = rng.uniform(1.0, 40.0)
        total = int(rate * rng.uniform(0.5, 8.0) * 3600)
        done = total * rng.uniform(0.0, 0.6)
        arrival = rng.uniform(0.0, NOW_S)
        views.append(
            JobView(
                job_id=f"job-{index}",
                job_type="synthetic",
                scale_factor=rng.choices([1, 2, 4], weights=[6, 3, 1])[0],
                total_steps=total,
                throughputs={"v100": rate},
                steps_done=done,
                arrival_s=arrival,
                time_on={"v100": done / rate},
            )
        )
    return JobsSnapshot(NOW_S, {"v100": gpus}, tuple(views), round_s=ROUND_S)


def measure(name: str, jobs: int, args: argparse.Namespace) -> dict[str, object]:
    seconds, outcomes = [], []
    for repeat in range(args.repeats):
        policy = POLICIES[name](args)
        snapshot = synthetic_queue(jobs, args.gpus, seed=repeat)
        started = time.perf_counter()
        try:
            policy.allocate(snapshot)
            report = getattr(policy, "last_solve", None)
            if report is None:
                outcomes.append("solved")
            else:
                outcomes.append(
                    "incumbent" if report.incumbent_only else "relaxed" if report.relaxed else "ftf"
                )
        except SolverFailed as failure:
            outcomes.append(f"failed ({failure.reason})")
        seconds.append(time.perf_counter() - started)
    return {
        "policy": name,
        "jobs": jobs,
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
        "outcomes": outcomes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="10,50,100,200,400")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=15.0, help="solver limit, s")
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    print(f"{'policy':<26}{'jobs':>6}{'median s':>11}{'max s':>9}  outcomes")
    for name in args.policy or sorted(POLICIES):
        for jobs in (int(n) for n in args.jobs.split(",")):
            row = measure(name, jobs, args)
            rows.append(row)
            print(
                f"{name:<26}{jobs:>6}{row['median_s']:>11.2f}{row['max_s']:>9.2f}  "
                + ", ".join(map(str, row["outcomes"]))
            )
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
