"""The README's "Results on Adobe's June trace": the tables, the plot and the JSON, in one run.

    python benchmarks/trace_results.py [--trace ../shared/traces/sensei_june_60sec.csv]
        [--json results/june.json] [--json-no-buffer results/june_buffer_hosts_0.json]
        [--plot docs/june.png]

Simulates the trace through ``notebookos``, ``reservation``, ``fcfs-batch`` and our
``packing`` with the simulator's default assumptions (the same run as ``kernelfleet simulate
--policy ...``), writes the JSON document and the plot, and prints the assumptions (each
policy's too), the Markdown table and the per-trace-hour comparison with NotebookOS's
published claim, ready for the README. Then ``notebookos`` and ``packing`` again with no buffer
host (``--SimulateApp.autoscale_buffer_hosts=0``, everything else the same), written to the
second JSON, and a side-by-side table: each pair shares one autoscaler config, so what
separates the two policies in a pair is packing's own choices, not a smaller buffer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.metrics import PolicyResult
from kernelfleet.scheduler.simulator.plot import plot
from kernelfleet.scheduler.simulator.report import (
    as_document,
    assumptions_text,
    policy_assumptions_text,
    resolve_policy,
)
from kernelfleet.scheduler.trace import read_trace

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("notebookos", "reservation", "fcfs-batch", "packing")
PAIR = ("notebookos", "packing")  # compared under each buffer setting
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


def buffer_table(by_buffer: dict[int, dict[str, PolicyResult]]) -> str:
    """`PAIR` side by side, one pair per buffer setting (identical autoscaler otherwise)."""
    lines = [
        "| buffer hosts | policy | GPU-h provisioned | packing saves vs notebookos "
        "| start delay p50 / p95 / p99 s | mean delay s | cells waiting > 10 s "
        "| migrations | scale-outs |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for buffer, results in sorted(by_buffer.items(), reverse=True):
        base = results["notebookos"].gpu_hours_provisioned
        for name in PAIR:
            r = results[name]
            delay = r.start_delay()
            saved = base - r.gpu_hours_provisioned
            saving = "" if name == "notebookos" else f"{saved:,.0f} ({saved / base:.1%})"
            late = sum(1 for d in r.delays_s if d > 10) / max(1, len(r.delays_s))
            lines.append(
                f"| {buffer} | `{name}` | {r.gpu_hours_provisioned:,.0f} | {saving} "
                f"| {delay['p50']:g} / {delay['p95']:g} / {delay['p99']:g} "
                f"| {statistics.fmean(r.delays_s or [0.0]):.1f} | {late:.1%} "
                f"| {r.migrations:,} | {r.scale_outs:,} |"
            )
    return "\n".join(lines)


def write(path: str, document: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_trace = REPO.parent / "shared" / "traces" / "sensei_june_60sec.csv"
    parser.add_argument("--trace", default=str(default_trace))
    parser.add_argument("--json", default=str(REPO / "results" / "june.json"))
    parser.add_argument(
        "--json-no-buffer", default=str(REPO / "results" / "june_buffer_hosts_0.json")
    )
    parser.add_argument("--plot", default=str(REPO / "docs" / "june.png"))
    args = parser.parse_args()

    trace = read_trace(args.trace)
    config = SimulationConfig()
    policies = [resolve_policy(name, config.autoscaling()) for name in POLICIES]
    results = simulate(trace, policies, config)
    no_buffer = replace(config, autoscale_buffer_hosts=0)
    pair = [resolve_policy(name, no_buffer.autoscaling()) for name in PAIR]
    pair_results = simulate(trace, pair, no_buffer)
    first = min(e.submit_min for e in trace.events)
    hours = (max(e.end_min for e in trace.events) - first) / 60

    write(args.json, as_document(config, results))
    write(args.json_no_buffer, as_document(no_buffer, pair_results))
    plot(results, args.plot)

    print(
        f"{trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions, "
        f"{hours:,.1f} trace hours\n"
    )
    print(assumptions_text(config, policies) + "\n")
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
    print(f"\nThe same with autoscale_buffer_hosts = {no_buffer.autoscale_buffer_hosts}:")
    for policy in pair:
        print(f"  {policy.name}: {policy_assumptions_text(policy)}")
    print()
    print(buffer_table({config.autoscale_buffer_hosts: results, 0: pair_results}))
    print(f"\nwrote {args.json}, {args.json_no_buffer} and {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
