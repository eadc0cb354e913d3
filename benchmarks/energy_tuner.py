"""The energy tuner on Zeus's power tables: how close it gets to the grid optimum, and what
it saves against the default setting.

    python benchmarks/energy_tuner.py [--trace DIR] [--seeds 3] [--evaluations 20]
                                      [--table v100:imagenet/resnet50 ...] [--workers 2]
                                      [--json OUT]

For every table (GPU x dataset/network/optimizer, `kernelfleet.tools.energy.replay`) and three
SLOs, it runs `tune` once per seed on the `ReplayBackend` and measures every setting of the
grid to know the true optimum. The SLOs, from the table itself:

- ``default``: the default setting's epoch time (no slower than untuned);
- ``+10%``: 1.1 x the default's epoch time;
- ``tight``: half way between the fastest epoch in the grid and the epoch time of the
  unconstrained energy optimum, so the SLO rules that optimum out (left out when the fastest
  setting is the energy optimum).

Per table and SLO it prints: the grid optimum's saving against the default (maximum power
limit, largest batch), the tuner's worst saving over the seeds, its worst gap to the optimum,
the evaluations it used, and the worst gap of random search given the same number of
evaluations (the same tuner with every evaluation random: what the Gaussian process adds).
A run passes when every seed is within 5 % of the optimum's energy; a run that reports an
SLO-violating setting as best is counted apart (it must never happen). Figures are printed,
never asserted. The trace folder is ``--trace``, else ``$KERNELFLEET_ZEUS_TRACE``, else
``../shared/data/zeus/trace`` next to the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from kernelfleet.tools.energy.replay import TRACE_VARIABLE, ReplayBackend, find_workload, workloads
from kernelfleet.tools.energy.tuner import tune

WITHIN = 0.05
SHARED_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "zeus" / "trace"


def slo_levels(backend: ReplayBackend) -> dict[str, float]:
    """The SLOs of one table (see the module's docstring)."""
    space = backend.space()
    default = backend.measure(space.default())
    grid = [backend.measure(s) for s in space.grid() if backend.covers(s)]
    fastest = min(m.latency_s for m in grid)
    optimum = min(grid, key=lambda m: (m.energy_j, m.latency_s))
    levels = {"default": default.latency_s, "+10%": 1.1 * default.latency_s}
    if optimum.latency_s > fastest:
        levels["tight"] = (fastest + optimum.latency_s) / 2
    return levels


def run_table(spec: str, folder: str, seeds: int, evaluations: int) -> list[dict[str, Any]]:
    """Every SLO level of one table: the optimum, and the tuner's and random search's runs."""
    _one_thread()
    backend = ReplayBackend.from_spec(spec, folder)
    space = backend.space()
    default = backend.measure(space.default())
    grid = [(s, backend.measure(s)) for s in space.grid() if backend.covers(s)]
    rows = []
    for level, slo in slo_levels(backend).items():
        feasible = [m.energy_j for _, m in grid if m.latency_s <= slo and m.energy_j is not None]
        optimum = min(feasible)
        runs = []
        for seed in range(seeds):
            result = tune(backend, slo, evaluations=evaluations, seed=seed)
            used = result.evaluations
            random = tune(backend, slo, evaluations=used, seed=seed, startup=used)
            runs.append(
                {
                    "seed": seed,
                    "evaluations": used,
                    "seconds": result.seconds,
                    "violating_best": _violates(result, slo),
                    "gap": _gap(result, optimum),
                    "saved": result.saved,
                    "random_gap": _gap(random, optimum),
                }
            )
        rows.append(
            {
                "table": spec,
                "grid": space.size,
                "level": level,
                "slo_s": slo,
                "feasible": len(feasible),
                "default_energy_j": default.energy_j,
                "optimum_energy_j": optimum,
                "optimum_saved": 1 - optimum / (default.energy_j or 1),
                "runs": runs,
                "passed": all(r["gap"] is not None and r["gap"] <= WITHIN for r in runs),
            }
        )
    return rows


def _one_thread() -> None:
    """Each worker process computes on one core (torch, under optuna's GP)."""
    import torch

    torch.set_num_threads(1)


def _gap(result: Any, optimum: float) -> float | None:
    if result.best is None or result.best.measurement.energy_j is None:
        return None
    return result.best.measurement.energy_j / optimum - 1


def _violates(result: Any, slo: float) -> bool:
    return result.best is not None and result.best.measurement.latency_s > slo


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("table", "grid", "SLO", "feasible", "optimum saves", "tuner saves (min)", "gap (max)",
              "evals (max)", "random gap (max)", "pass")  # fmt: skip
    lines = [header]
    for row in rows:
        runs = row["runs"]
        gaps = [r["gap"] for r in runs]
        random_gaps = [r["random_gap"] for r in runs]
        lines.append(
            (
                row["table"],
                str(row["grid"]),
                f"{row['level']} {row['slo_s']:.0f} s",
                str(row["feasible"]),
                _percent(row["optimum_saved"]),
                _percent(min((r["saved"] for r in runs if r["saved"] is not None), default=None)),
                _percent(None if None in gaps else max(gaps)),
                str(max(r["evaluations"] for r in runs)),
                _percent(None if None in random_gaps else max(random_gaps)),
                "yes" if row["passed"] else "NO",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tables = sorted({row["table"] for row in rows})
    passed_tables = [t for t in tables if all(r["passed"] for r in rows if r["table"] == t)]
    runs = [run for row in rows for run in row["runs"]]
    return {
        "tables": len(tables),
        "tables_passed_every_slo": len(passed_tables),
        "table_slo_pairs": len(rows),
        "pairs_passed": sum(row["passed"] for row in rows),
        "runs": len(runs),
        "runs_within_5pct": sum(r["gap"] is not None and r["gap"] <= WITHIN for r in runs),
        "random_runs_within_5pct": sum(
            r["random_gap"] is not None and r["random_gap"] <= WITHIN for r in runs
        ),
        "violating_best": sum(r["violating_best"] for r in runs),
        "median_evaluations": statistics.median(r["evaluations"] for r in runs),
        "median_tune_seconds": statistics.median(r["seconds"] for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help=f"the Zeus trace folder (else ${TRACE_VARIABLE})")
    parser.add_argument("--seeds", type=int, default=3, help="tuner runs per table and SLO")
    parser.add_argument("--evaluations", type=int, default=20, help="the tuner's budget")
    parser.add_argument("--table", action="append", dest="tables", metavar="SPEC",
                        help="GPU:DATASET/NETWORK[/OPTIMIZER] (default: every table)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    folder = args.trace or os.environ.get(TRACE_VARIABLE) or str(SHARED_TRACE)
    specs = [str(find_workload(s, folder)) for s in args.tables or []] or [
        str(w) for w in workloads(folder)
    ]
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [
            pool.submit(run_table, spec, folder, args.seeds, args.evaluations) for spec in specs
        ]
        rows = [row for future in futures for row in future.result()]
    print_table(rows)
    summary = summarise(rows) | {"wall_s": time.monotonic() - started}
    print()
    for key, value in summary.items():
        print(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
