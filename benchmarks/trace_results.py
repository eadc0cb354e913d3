"""The README's "Results on Adobe's June trace": the table, the plot and the JSON, in one run.

    python benchmarks/trace_results.py [--trace ../shared/traces/sensei_june_60sec.csv]
        [--json results/june.json] [--plot docs/june.png]

Simulates the trace through ``notebookos``, ``reservation``, ``fcfs-batch`` and our
``packing`` with the simulator's default assumptions (the same run as ``kernelfleet simulate
--policy ...``), writes the JSON document and the plot, and prints the Markdown table and the
per-trace-hour comparison with NotebookOS's published claim, ready for the README.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.metrics import PolicyResult
from kernelfleet.scheduler.simulator.plot import plot
from kernelfleet.scheduler.simulator.report import as_document, resolve_policy
from kernelfleet.scheduler.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("notebookos", "reservation", "fcfs-batch", "packing")
# NotebookOS (arXiv 2503.20591): "saves 1,187+ GPU hours over a 17.5-hour real-world workload"
CLAIM_GPU_HOURS, CLAIM_TRACE_HOURS = 1187.0, 17.5


def markdown_table(results: dict[str, PolicyResult], hours: float) -> str:
    baseline = results["reservation"].gpu_hours_provisioned
    lines = [
        "| policy | GPU-h provisioned | GPU-h committed | saved vs reservation (per trace hour) "
        "| start delay p50 / p95 / p99 s | migrations | scale-outs / -ins | events |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        delay = r.start_delay()
        saved = baseline - r.gpu_hours_provisioned
        lines.append(
            f"| `{name}` | {r.gpu_hours_provisioned:,.0f} | {r.gpu_hours_committed:,.0f} "
            f"| {saved:,.0f} ({saved / hours:,.1f}) "
            f"| {delay['p50']:g} / {delay['p95']:g} / {delay['p99']:g} "
            f"| {r.migrations:,} | {r.scale_outs:,} / {r.scale_ins:,} | {r.events:,} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_trace = REPO.parent / "shared" / "traces" / "sensei_june_60sec.csv"
    parser.add_argument("--trace", default=str(default_trace))
    parser.add_argument("--json", default=str(REPO / "results" / "june.json"))
    parser.add_argument("--plot", default=str(REPO / "docs" / "june.png"))
    args = parser.parse_args()

    trace = read_trace(args.trace)
    config = SimulationConfig()
    policies = [resolve_policy(name, config.autoscaling()) for name in POLICIES]
    results = simulate(trace, policies, config)
    first = min(e.submit_min for e in trace.events)
    hours = (max(e.end_min for e in trace.events) - first) / 60

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    document = as_document(config, results)
    Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    plot(results, args.plot)

    print(
        f"{trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions, "
        f"{hours:,.1f} trace hours\n"
    )
    print(markdown_table(results, hours))
    reservation = results["reservation"].gpu_hours_provisioned
    print(
        f"\nNotebookOS's claim: {CLAIM_GPU_HOURS:,.0f} GPU-h over {CLAIM_TRACE_HOURS} h = "
        f"{CLAIM_GPU_HOURS / CLAIM_TRACE_HOURS:.1f} GPU-h saved per trace hour"
    )
    for name in ("notebookos", "packing"):
        saved = reservation - results[name].gpu_hours_provisioned
        print(
            f"{name} here: {saved:,.0f} GPU-h over {hours:,.1f} h = {saved / hours:.1f} "
            f"per trace hour ({saved / reservation:.1%} of reservation's provisioned)"
        )
    print(f"\nwrote {args.json} and {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
