"""The predictor-driven autoscaling rule on a trace of the same kind as June but not June: a
resampled June (docs/economics.md, "Another trace").

    python benchmarks/demand_resampled.py TRACE [--seed 1] [--shift-days 7]

The resampled trace draws as many sessions as the trace has, with replacement, and moves each by
a whole number of days drawn in ``[-shift_days, shift_days]`` (kept within the trace's span): the
same sessions' shapes, GPU needs and daily cycle, in another order and mix. It is built in
memory (no file). Then, as on June: a demand model trained on its first 7 days (the knobs chosen
on June's first week, unchanged), its scores on the later steps, and the sessions that start
after day 7 simulated under NotebookOS's rule (``before``), ``steady`` and ``steady`` with the
model (``predicted``), for the per-cell policies and ``reservation`` (the baseline of the share,
under ``before``). Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random

from kernelfleet.scheduler.demand_train import train
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.metrics import percentile
from kernelfleet.scheduler.simulator.report import resolve_policy
from kernelfleet.scheduler.trace import Session, Trace, TraceEvent, read_trace

STEADY = {"scale_in_idle_s": 1200.0, "scale_in_headroom": 1.2, "autoscale_buffer_hosts": 0}
POLICIES = ["notebookos", "fcfs-batch", "packing"]


def resample(trace: Trace, seed: int, shift_days: int) -> Trace:
    """The resampled trace described in the module docstring."""
    rng = random.Random(seed)
    start = min(s.start_min for s in trace.sessions)
    end = max(s.end_min for s in trace.sessions)
    sessions, events = [], []
    while len(sessions) < len(trace.sessions):
        source = rng.choice(trace.sessions)
        shift = rng.randint(-shift_days, shift_days) * 1440
        if not start <= source.start_min + shift <= source.end_min + shift <= end:
            continue
        moved = tuple(
            TraceEvent(
                line=len(events) + i + 2,
                job_id=f"{len(sessions)}.{i}",
                gpus=e.gpus,
                submit_min=e.submit_min + shift,
                duration_min=e.duration_min,
                model_name=e.model_name,
            )
            for i, e in enumerate(source.events)
        )
        sessions.append(Session(len(sessions), source.gpus, moved))
        events.extend(moved)
    return Trace(f"{trace.path} resampled (seed {seed})", tuple(events), tuple(sessions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shift-days", type=int, default=7)
    args = parser.parse_args()
    trace = resample(read_trace(args.trace), args.seed, args.shift_days)
    model, scores = train(trace, first_days=7, horizon_s=600, quantile=0.5)
    assert scores is not None
    print(
        f"{trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions; "
        f"peak busy GPUs 600 s ahead on {scores.steps:,} held-back steps: forest MAE "
        f"{scores.forest_mae:.2f}, moving average {scores.baseline_mae:.2f}, busy now "
        f"{scores.persistence_mae:.2f}"
    )
    first = min(s.start_min for s in trace.sessions)
    held_out = trace.select(start_min=first + 7 * 1440)
    rules = {
        "before": (SimulationConfig(), None),
        "steady": (SimulationConfig(**STEADY), None),
        "predicted": (SimulationConfig(**STEADY), model),
    }
    baseline = floor = 0.0
    print("rule       policy       GPU-h prov  share  p50/p95/p99 s   scale-outs")
    for rule, (config, demand_model) in rules.items():
        names = POLICIES + (["reservation"] if rule == "before" else [])
        policies = [resolve_policy(name, config.autoscaling()) for name in names]
        results = simulate(held_out, policies, config, demand_model=demand_model)
        if rule == "before":
            baseline = results["reservation"].gpu_hours_provisioned
            floor = results["reservation"].gpu_hours_floor
        for name, result in results.items():
            share = (baseline - result.gpu_hours_provisioned) / (baseline - floor)
            delays = sorted(result.delays_s)
            p = [percentile(delays, q) for q in (50, 95, 99)]
            print(
                f"{rule:<10} {name:<12} {result.gpu_hours_provisioned:>10,.0f} {share:>6.0%}  "
                f"{p[0]:.0f} / {p[1]:.0f} / {p[2]:.0f}   {result.scale_outs:>8,}"
            )


if __name__ == "__main__":
    main()
