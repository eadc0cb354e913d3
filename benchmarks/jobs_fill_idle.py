"""How much of a notebook fleet's idle GPU time background jobs can fill, cells first.

    python benchmarks/jobs_fill_idle.py [--trace ../shared/traces/sensei_june_60sec.csv]
        [--throughputs ../shared/data/gavel/physical_cluster_throughputs.json] [--gpu-type v100]
        [--jobs-per-hour 4] [--policy max_min_fairness] [--round-s 360] [--seed 0]
        [--days N] [--json OUT]

1. The notebook trace runs through the ``notebookos`` policy in the trace simulator (the same run
   as ``kernelfleet simulate``): GPUs provisioned and GPUs committed to cells, over time.
2. A Gavel-style stream of training jobs (`kernelfleet.scheduler.jobs.workload`) arrives over the
   same span, and the job simulator runs it with a Gavel policy on the GPUs the cells leave idle:
   each round, jobs may use only the GPUs that stay uncommitted for the whole round (cells come
   first; a job never holds a GPU a cell wants, so no preemption is modelled here).
3. It prints the fleet's GPU utilisation (GPU-hours used over GPU-hours provisioned) without and
   with the jobs, the jobs' GPU-hours, how many finished within the span, and their average JCT.

The fleet view is GPU counts only: a multi-GPU job is assumed to fit when enough GPUs are idle
in the fleet, whatever hosts they are on (the live gateway places a job's GPUs on one host).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kernelfleet.scheduler.jobs.policy import load_job_policy
from kernelfleet.scheduler.jobs.simulator import simulate_jobs
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.workload import job_stream
from kernelfleet.scheduler.policy import load_policy
from kernelfleet.scheduler.simulator import Simulation, SimulationConfig
from kernelfleet.scheduler.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


class StepFunction:
    """A value that changes at instants, from a simulator gauge's ``(time, value)`` history."""

    def __init__(self, history: Sequence[tuple[float, float]]) -> None:
        self.times = [t for t, _ in history]
        self.values = [v for _, v in history]

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[max(i, 0)]

    def minimum(self, start: float, end: float) -> float:
        """The least value over ``[start, end)``."""
        lowest = self.at(start)
        i = bisect.bisect_right(self.times, start)
        while i < len(self.times) and self.times[i] < end:
            lowest = min(lowest, self.values[i])
            i += 1
        return lowest


def idle_gpus(
    provisioned: Sequence[tuple[float, float]], committed: Sequence[tuple[float, float]]
) -> StepFunction:
    """Provisioned minus committed GPUs, as one step function."""
    p, c = StepFunction(provisioned), StepFunction(committed)
    times = sorted({t for t, _ in provisioned} | {t for t, _ in committed})
    return StepFunction([(t, p.at(t) - c.at(t)) for t in times])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(SHARED / "traces" / "sensei_june_60sec.csv"))
    parser.add_argument(
        "--throughputs", default=str(SHARED / "data/gavel/physical_cluster_throughputs.json")
    )
    parser.add_argument("--gpu-type", default="v100", help="the fleet's GPU type in the table")
    parser.add_argument("--jobs-per-hour", type=float, default=4.0)
    parser.add_argument("--policy", default="max_min_fairness")
    parser.add_argument("--round-s", type=float, default=360.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=float, default=0.0, help="only the trace's first N days")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)

    trace = read_trace(args.trace)
    if args.days > 0:
        first = min(session.start_min for session in trace.sessions)
        within = [s for s in trace.sessions if s.start_min < first + args.days * 24 * 60]
        trace = trace.select(first, sessions=len(within))
    began = time.perf_counter()
    cells = Simulation(load_policy("notebookos"), trace, SimulationConfig()).run()
    cells_s = time.perf_counter() - began
    start = cells.provisioned_history[0][0]
    end = cells.end_s
    idle = idle_gpus(cells.provisioned_history, cells.committed_history)

    def lent(now_s: float) -> dict[str, int]:
        return {args.gpu_type: int(idle.minimum(now_s, now_s + args.round_s))}

    table = ThroughputTable.load(args.throughputs)
    jobs = job_stream(
        table, [args.gpu_type], args.jobs_per_hour, end - start, args.seed, start_s=start
    )
    peak = int(max(value for _, value in cells.provisioned_history))
    policy = load_job_policy(args.policy)
    began = time.perf_counter()
    run = simulate_jobs(
        jobs,
        {args.gpu_type: peak},
        policy,
        round_s=args.round_s,
        seed=args.seed,
        fallback=load_job_policy("fifo"),
        lent=lent,
        until_s=end,
    )
    jobs_s = time.perf_counter() - began

    provisioned_h = cells.gpu_hours_provisioned
    used_cells_h = cells.gpu_hours_committed
    used_jobs_h = run.busy_gpu_s / 3600
    figures = {
        "trace": args.trace,
        "span_h": (end - start) / 3600,
        "gpu_hours_provisioned": provisioned_h,
        "gpu_hours_cells": used_cells_h,
        "gpu_hours_idle": provisioned_h - used_cells_h,
        "gpu_hours_jobs": used_jobs_h,
        "utilisation_without_jobs": used_cells_h / provisioned_h,
        "utilisation_with_jobs": (used_cells_h + used_jobs_h) / provisioned_h,
        "idle_filled": used_jobs_h / max(provisioned_h - used_cells_h, 1e-9),
        "jobs_submitted": len(jobs),
        "jobs_finished": run.jobs,
        "jobs_unfinished": run.unfinished,
        "avg_jct_h": run.avg_jct_s / 3600,
        "policy": policy.name,
        "jobs_per_hour": args.jobs_per_hour,
        "allocations": run.allocations,
        "solver_s": run.solver_s,
        "simulated_s": {"cells": cells_s, "jobs": jobs_s},
    }
    print(
        f"{args.trace}: {figures['span_h']:.0f} h, notebookos fleet of up to {peak} GPUs\n"
        f"  GPU-hours provisioned {provisioned_h:,.0f}; cells {used_cells_h:,.0f}; "
        f"idle {provisioned_h - used_cells_h:,.0f}\n"
        f"  jobs ({args.jobs_per_hour:g}/h, {policy.name}): {len(jobs)} submitted, "
        f"{run.jobs} finished (avg JCT {run.avg_jct_s / 3600:.2f} h), {run.unfinished} "
        f"unfinished at the end; {used_jobs_h:,.0f} GPU-hours\n"
        f"  utilisation without jobs {figures['utilisation_without_jobs']:.1%}, with jobs "
        f"{figures['utilisation_with_jobs']:.1%} ({figures['idle_filled']:.1%} of the idle "
        f"GPU-hours filled)\n"
        f"  simulated in {cells_s:.1f} s (cells) + {jobs_s:.1f} s (jobs; {run.allocations} "
        f"allocations, {run.solver_s:.1f} s solving)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
