"""Throughput of torch's pipeline schedules on worker processes, against one process.

    python benchmarks/pipeline_schedules.py [--ranks 2] [--microbatches 1,2,4,8] [--steps 6]
        [--repeats 3] [--batch 256] [--width 1024] [--layers 8] [--replicas 2x1,1x2]
        [--schedules gpipe,1f1b,interleaved] [--json OUT]

The model is an MLP of ``--layers`` blocks (``Linear(width, width)`` + ``ReLU``) and a
``Linear(width, 10)`` head, trained with cross-entropy and SGD on one random batch. The baseline
trains it in this process (torch's threads on every core); each pipelined run trains it with
`kernelfleet.tools.pipeline.runner.run_pipeline` on ``R`` worker processes (each with
``cores // R`` threads, on the CPU with gloo), its blocks split evenly into ``R`` stages (GPipe,
1F1B) or ``2R`` stages, two per rank (interleaved 1F1B). ``--replicas 2x1`` adds replicated
layouts (their own rows, ``layout`` giving each stage's replicas): as many stages as counts, the
blocks split evenly, stage ``i`` on ``r_i`` ranks, run with the replicated executor under GPipe
and 1F1B ordering. One `WorkerPool` per layout serves every schedule and microbatch count.

Throughput is the batch over the median step time, the first step (which sets the pipeline up)
left out. The baseline is measured again right before every pipelined run, ``--repeats`` pairs
of them per configuration, and the table gives the median of each and the ratio of the
medians, so that load from other processes on the host falls on both alike; the header gives
the host's load average. A layout a schedule
refuses (1F1B with fewer microbatches than stages) is shown as such. ``--json`` writes the same
figures. A second baseline runs on one thread: against it, ``R`` pipelined workers (each on
``cores // R`` threads) could reach at most ``cores`` times, less the bubble. On a CPU host the
ranks share the cores the first baseline uses alone, so pipelining can at best match that one;
on a host loaded by other processes, though, a multi-threaded process suffers more than
single-threaded ones (its threads wait for each other), which the ratios then show too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import torch

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.replicas import REPLICATED_SCHEDULES
from kernelfleet.tools.pipeline.runner import WorkerPool, run_pipeline

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def make_model(layers: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    children: list[torch.nn.Module] = []
    for _ in range(layers):
        children += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    children.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*children)


def even_ranges(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """``stages`` ranges over the model's children: blocks split as evenly as they go, the
    head with the last stage (each block is two children, Linear and ReLU)."""
    bounds = [round(index * layers / stages) for index in range(stages + 1)]
    ranges = [(2 * bounds[i], 2 * bounds[i + 1] - 1) for i in range(stages)]
    ranges[-1] = (ranges[-1][0], 2 * layers)
    return tuple(ranges)


def baseline(args: argparse.Namespace, inputs: Any, targets: Any, threads: int) -> float:
    """Samples per second of the same training in this process, on ``threads`` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train_here(args, inputs, targets)
    finally:
        torch.set_num_threads(previous)


def _train_here(args: argparse.Namespace, inputs: Any, targets: Any) -> float:
    model = make_model(args.layers, args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seconds = []
    for _ in range(args.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
    return steady_rate(args.batch, seconds)


def steady_rate(batch: int, seconds: list[float] | tuple[float, ...]) -> float:
    """Samples per second at the median step time, the first step left out."""
    return batch / statistics.median(seconds[1:] or seconds)


def pipelined(
    args: argparse.Namespace,
    pool: WorkerPool,
    schedule: str,
    microbatches: int,
    data: Any,
    replicas: tuple[int, ...] | None = None,
) -> float | str:
    if replicas is not None:
        stages = len(replicas)
    else:
        stages = 2 * pool.ranks if schedule == "interleaved" else pool.ranks
    try:
        result = run_pipeline(
            make_model(args.layers, args.width),
            even_ranges(args.layers, stages),
            *data,
            loss=torch.nn.functional.cross_entropy,
            schedule=schedule,
            microbatches=microbatches,
            steps=args.steps,
            pool=pool,
            replicas=replicas,
        )
    except InvalidRequest as refused:
        return f"refused: {refused.message}"
    return steady_rate(args.batch, result.step_seconds)


def layouts(args: argparse.Namespace) -> list[tuple[int, tuple[int, ...] | None, tuple[str, ...]]]:
    """``(ranks, replicas, schedules)`` to measure: one stage per rank for each ``--ranks``
    (replicas None: torch's schedules), then each ``--replicas`` layout."""
    asked = tuple(args.schedules.split(","))
    plain = [(int(r), None, asked) for r in args.ranks.split(",") if r]
    replicated = []
    for text in filter(None, args.replicas.split(",")):
        counts = tuple(int(count) for count in text.split("x"))
        replicated.append(
            (sum(counts), counts, tuple(s for s in asked if s in REPLICATED_SCHEDULES))
        )
    return plain + replicated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2", help="worker counts, comma-separated (2)")
    parser.add_argument("--microbatches", default="1,2,4,8", help="comma-separated (1,2,4,8)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs (3)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated")
    parser.add_argument(
        "--replicas", default="", help="replicated layouts, e.g. 2x1,1x2 (replicas per stage)"
    )
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(1)
    data = (
        torch.randn(args.batch, args.width, generator=generator),
        torch.randint(0, 10, (args.batch,), generator=generator),
    )
    print(
        f"MLP {args.layers}x{args.width}, batch {args.batch}, {args.steps} steps, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, load {os.getloadavg()[0]:.1f}"
    )
    header = f"{'ranks':>5}  {'layout':<8}{'schedule':<12}{'microbatches':>12}{'samples/s':>12}"
    print(f"{header}{'one process':>13}{'ratio':>7}{'one thread':>12}{'ratio':>7}")
    cores = os.cpu_count() or 1
    runs: list[dict[str, Any]] = []
    for ranks, replicas, schedules in layouts(args):
        layout = "x".join(map(str, replicas or (1,) * ranks))
        with WorkerPool(ranks, gpus=[]) as pool:
            for schedule in schedules:
                for microbatches in (int(m) for m in args.microbatches.split(",")):
                    bases, singles, rates = [], [], []
                    for _ in range(args.repeats):
                        bases.append(baseline(args, *data, threads=cores))
                        singles.append(baseline(args, *data, threads=1))
                        rates.append(pipelined(args, pool, schedule, microbatches, data, replicas))
                    base, single = statistics.median(bases), statistics.median(singles)
                    rate = rates[0] if isinstance(rates[0], str) else statistics.median(rates)
                    run = {
                        "ranks": ranks,
                        "replicas": list(replicas or (1,) * ranks),
                        "schedule": schedule,
                        "microbatches": microbatches,
                    }
                    row = f"{ranks:>5}  {layout:<8}{schedule:<12}{microbatches:>12}"
                    if isinstance(rate, str):
                        runs.append(run | {"note": rate})
                        print(f"{row}  {rate}")
                        continue
                    runs.append(
                        run
                        | {
                            "samples_per_s": rate,
                            "one_process_samples_per_s": base,
                            "one_thread_samples_per_s": single,
                        }
                    )
                    print(
                        f"{row}{rate:>12.1f}"
                        f"{base:>13.1f}{rate / base:>6.2f}x{single:>12.1f}{rate / single:>6.2f}x"
                    )
    if args.json:
        document = {
            "model": {"layers": args.layers, "width": args.width, "batch": args.batch},
            "steps": args.steps,
            "repeats": args.repeats,
            "host": {"cores": os.cpu_count(), "machine": platform.machine()},
            "torch": torch.__version__,
            "load_average": os.getloadavg()[0],
            "runs": runs,
        }
        with open(args.json, "w") as out:
            json.dump(document, out, indent=2)


if __name__ == "__main__":
    main()
