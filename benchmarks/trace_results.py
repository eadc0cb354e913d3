"""The README's "Results on Adobe's June trace": every table, the plot and the JSON, in one run.

    python benchmarks/trace_results.py [--trace ../shared/traces/sensei_june_60sec.csv]
        [--json results/june.json] [--json-no-buffer results/june_buffer_hosts_0.json]
        [--json-spot results/june_spot_mixed.json] [--plot docs/june.png | --no-plot]

Three simulations of the trace, each the same run as ``kernelfleet simulate`` with those
options (so each JSON is that command's document):

1. ``notebookos``, ``reservation``, ``fcfs-batch`` and our ``packing`` with the simulator's
   default assumptions, an on-demand-only fleet: the JSON, the plot, and the table of every
   policy (GPU-hours provisioned, committed and busy, share of the possible saving, start delay
   percentiles, scale-outs/-ins, migrations, dollars), the floor, and the per-trace-hour
   comparison with NotebookOS's published claim;
2. ``notebookos`` and ``packing`` with no buffer host (``--SimulateApp.autoscale_buffer_hosts=0``,
   everything else the same; saving shares against a reservation run under that setting), and a
   side-by-side table: each pair shares one autoscaler config, so what separates the two
   policies in a pair is packing's own choices, not a smaller buffer;
3. the four policies on a mixed fleet (``--SimulateApp.spot_share=0.33``), and its table with
   each policy's dollars against its on-demand-only run.

The tables are Markdown, ready for the README; tests/scheduler/test_trace_results.py checks
that the README's tables are these, rebuilt from the JSON files in results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.policy import Policy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.metrics import PolicyResult
from kernelfleet.scheduler.simulator.plot import plot, require_matplotlib
from kernelfleet.scheduler.simulator.report import (
    as_document,
    assumptions_text,
    floor_text,
    policy_assumptions_text,
    resolve_policy,
)
from kernelfleet.scheduler.trace import Trace, read_trace

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("notebookos", "reservation", "fcfs-batch", "packing")
PAIR = ("notebookos", "packing")  # compared under each buffer setting
SPOT_SHARE = 0.33  # a third of the hosts: what the minority replicas of 3 can fill
# NotebookOS (arXiv 2503.20591): "saves 1,187+ GPU hours over a 17.5-hour real-world workload"
CLAIM_GPU_HOURS, CLAIM_TRACE_HOURS = 1187.0, 17.5

Policies = dict[str, dict[str, Any]]
"""The ``"policies"`` of a simulator JSON document: each policy's `PolicyResult.as_json`."""


def share_text(result: dict[str, Any]) -> str:
    """The share of the possible saving as a whole percentage; "-" where there is none."""
    share = result["saving_share"]
    return "-" if share is None else f"{share:.0%}"


def delay_text(result: dict[str, Any]) -> str:
    delay = result["start_delay_s"]
    return f"{delay['p50']:g} / {delay['p95']:g} / {delay['p99']:g}"


def policy_table(policies: Policies) -> str:
    """Every policy of one run: the columns issue 17 asks for, GPU-hours first."""
    lines = [
        "| policy | GPU-h provisioned | GPU-h committed | GPU-h busy | share of the saving "
        "| start delay p50 / p95 / p99 s | scale-outs / -ins | migrations | dollars |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in policies.items():
        lines.append(
            f"| `{name}` | {r['gpu_hours_provisioned']:,.0f} | {r['gpu_hours_committed']:,.0f} "
            f"| {r['gpu_hours_busy']:,.0f} | {share_text(r)} | {delay_text(r)} "
            f"| {r['scale_outs']:,} / {r['scale_ins']:,} | {r['migrations']:,} "
            f"| {r['dollars']:,.0f} |"
        )
    return "\n".join(lines)


def spot_table(mixed: Policies, on_demand: Policies) -> str:
    """Every policy of the mixed-fleet run; dollars with their change against the same
    policy's on-demand-only run (left out where there is none to speak of)."""
    lines = [
        "| policy | GPU-h provisioned (on spot) | share of the saving "
        "| start delay p50 / p95 / p99 s | scale-outs / -ins | migrations "
        "| dollars (vs on-demand only) | revocations | cells cut | kernels lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in mixed.items():
        dollars = f"{r['dollars']:,.0f}"
        change = r["dollars"] / on_demand[name]["dollars"] - 1
        if abs(change) >= 0.0005:
            dollars += f" ({change:+.1%})".replace("-", "\N{MINUS SIGN}")
        lines.append(
            f"| `{name}` | {r['gpu_hours_provisioned']:,.0f} ({r['gpu_hours_spot']:,.0f}) "
            f"| {share_text(r)} | {delay_text(r)} | {r['scale_outs']:,} / {r['scale_ins']:,} "
            f"| {r['migrations']:,} | {dollars} | {r['revocations']:,} "
            f"| {r['cells_interrupted']:,} | {r['kernels_lost']:,} |"
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
            saved = base - r.gpu_hours_provisioned
            saving = "" if name == "notebookos" else f"{saved:,.0f} ({saved / base:.1%})"
            late = sum(1 for d in r.delays_s if d > 10) / max(1, len(r.delays_s))
            lines.append(
                f"| {buffer} | `{name}` | {r.gpu_hours_provisioned:,.0f} | {saving} "
                f"| {delay_text(r.as_json())} "
                f"| {statistics.fmean(r.delays_s or [0.0]):.1f} | {late:.1%} "
                f"| {r.migrations:,} | {r.scale_outs:,} |"
            )
    return "\n".join(lines)


def claim_text(results: dict[str, PolicyResult], hours: float) -> str:
    """GPU-hours saved against `reservation` per trace hour, beside NotebookOS's claim."""
    reservation = results["reservation"].gpu_hours_provisioned
    lines = [
        f"NotebookOS's claim: {CLAIM_GPU_HOURS:,.0f} GPU-h over {CLAIM_TRACE_HOURS} h = "
        f"{CLAIM_GPU_HOURS / CLAIM_TRACE_HOURS:.1f} GPU-h saved per trace hour"
    ]
    for name in PAIR:
        saved = reservation - results[name].gpu_hours_provisioned
        lines.append(
            f"{name} here: {saved:,.0f} GPU-h over {hours:,.1f} h = {saved / hours:.1f} "
            f"per trace hour ({saved / reservation:.1%} of reservation's provisioned)"
        )
    return "\n".join(lines)


def trace_hours(trace: Trace) -> float:
    first = min(e.submit_min for e in trace.events)
    return (max(e.end_min for e in trace.events) - first) / 60


def run(
    trace: Trace, names: tuple[str, ...], config: SimulationConfig
) -> tuple[list[Policy], dict[str, PolicyResult]]:
    """`names` through `trace` as ``kernelfleet simulate`` runs them (a reservation run as the
    saving's reference when it is not among them): the policies and their results."""
    policies = [resolve_policy(name, config.autoscaling()) for name in names]
    return policies, simulate(trace, policies, config, reference=True)


def write(path: str, document: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_trace = REPO.parent / "shared" / "traces" / "sensei_june_60sec.csv"
    results_dir = REPO / "results"
    parser.add_argument("--trace", default=str(default_trace))
    parser.add_argument("--json", default=str(results_dir / "june.json"))
    parser.add_argument("--json-no-buffer", default=str(results_dir / "june_buffer_hosts_0.json"))
    parser.add_argument("--json-spot", default=str(results_dir / "june_spot_mixed.json"))
    parser.add_argument("--plot", default=str(REPO / "docs" / "june.png"))
    parser.add_argument(
        "--no-plot", action="store_true", help="write no plot (matplotlib is not needed)"
    )
    args = parser.parse_args(argv)
    # what would stop the run is said before it, not after; parser.error exits 2
    if not args.no_plot:
        try:
            require_matplotlib()
        except InvalidRequest as error:
            parser.error(f"{error}; --no-plot writes the JSON and tables without it")
    try:
        trace = read_trace(args.trace)
    except InvalidRequest as error:
        parser.error(str(error))
    config = SimulationConfig()
    policies, results = run(trace, POLICIES, config)
    no_buffer = replace(config, autoscale_buffer_hosts=0)
    pair, pair_results = run(trace, PAIR, no_buffer)
    mixed = replace(config, spot_share=SPOT_SHARE)
    _, mixed_results = run(trace, POLICIES, mixed)

    document = as_document(config, results)
    mixed_document = as_document(mixed, mixed_results)
    write(args.json, document)
    write(args.json_no_buffer, as_document(no_buffer, pair_results))
    write(args.json_spot, mixed_document)
    written = [args.json, args.json_no_buffer, args.json_spot]
    if not args.no_plot:
        plot(results, args.plot)
        written.append(args.plot)

    hours = trace_hours(trace)
    print(
        f"{trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions, "
        f"{hours:,.1f} trace hours\n"
    )
    print(assumptions_text(config, policies) + "\n")
    print(policy_table(document["policies"]))
    print("\n" + floor_text(results))
    print("\n" + claim_text(results, hours))
    print(f"\nThe same with autoscale_buffer_hosts = {no_buffer.autoscale_buffer_hosts}:")
    for policy in pair:
        print(f"  {policy.name}: {policy_assumptions_text(policy)}")
    print()
    print(buffer_table({config.autoscale_buffer_hosts: results, 0: pair_results}))
    print(f"\nA mixed fleet, spot_share = {mixed.spot_share:g} (everything else the same):\n")
    print(spot_table(mixed_document["policies"], document["policies"]))
    print(f"\nwrote {', '.join(written)}", file=sys.stderr)


if __name__ == "__main__":
    main()
