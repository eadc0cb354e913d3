"""Pufferfish against full rank and PowerSGD: bytes all-reduced and time per step of a
ResNet-18-size model in 2-process gloo DDP on CPU.

    python benchmarks/pufferfish_ddp.py [--steps 5] [--warmup-steps 3] [--rounds 2] [--batch 8]
        [--image 16] [--rank-ratio 0.25] [--powersgd-rank 4] [--threads 1] [--bucket-mb 100]
        [--modes full,factorised,powersgd] [--json OUT]

Two worker processes (gloo over loopback, a file rendezvous) train the same seeded
`resnet18` (SGD with momentum, random data, each rank its own) in three modes, round-robin
for ``--rounds`` rounds so background load falls on all alike:

  full        full rank; a counting hook wraps DDP's default all-reduce (`ddp`)
  factorised  `factorize` at ``--rank-ratio`` (first and last layers kept full, SVD-initialised
              from the seeded weights); the same counting hook
  powersgd    full rank with PyTorch's PowerSGD hook (``matrix_approximation_rank`` =
              ``--powersgd-rank``, error feedback, warm start, compression from step 2, so every
              measured step is compressed); its collectives are counted by a proxy for the
              hook module's ``torch.distributed`` that adds up each ``all_reduce``'s tensor

A step is forward, backward (with the all-reduce) and the optimizer step. Each mode runs
``--warmup-steps`` unmeasured steps, then ``--steps`` measured ones between barriers; a step's
time is the slower rank's. Per mode: parameters, bytes all-reduced per measured step (and the
closed form: `FactorizationPlan.bytes_before` / `bytes_after`; for PowerSGD, P and Q of
``(rows + cols) x rank`` for each matrix PowerSGD compresses, the rest uncompressed), the median
step time over all rounds, the ratios against full rank, and the time of one all-reduce of
that many bytes alone, as one flat float32 buffer (what the step's communication costs with no
compute beside it; PowerSGD makes three smaller all-reduces per bucket instead). DDP runs with
``--bucket-mb 100`` (one bucket for ResNet-18 after DDP's 1 MB first one) in every mode: with
several large buckets, PowerSGD's hook over gloo aborted with a collective mismatch between the
ranks (docs/pufferfish.md). The machine's load average goes in the JSON: on a shared 2-core
machine it moves the times.
``--json OUT`` writes it all.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from kernelfleet.tools.pufferfish.ddp import ByteCounter, counting_allreduce_hook
from kernelfleet.tools.pufferfish.factorize import factorize, plan_factorization
from kernelfleet.tools.pufferfish.models import resnet18

MODES = ("full", "factorised", "powersgd")
POWERSGD_START = 2
POWERSGD_MIN_COMPRESSION = 2.0  # PowerSGDState's default


class CountingCollectives:
    """Stands for ``torch.distributed`` inside the PowerSGD hook's module: ``all_reduce`` adds
    its tensor's bytes to `bytes`, then calls the real one; everything else is the real one."""

    def __init__(self) -> None:
        self.bytes = 0

    def all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.bytes += tensor.numel() * tensor.element_size()
        return dist.all_reduce(tensor, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


def build(mode: str, ratio: float) -> nn.Module:
    torch.manual_seed(0)
    model = resnet18()
    if mode == "factorised":
        factorize(model, ratio)
    return model


def powersgd_closed_form(model: nn.Module, rank: int) -> int:
    """Bytes PowerSGD all-reduces per step: for each gradient of 2 or more dimensions viewed as
    rows x cols (rows the first dimension), P and Q, (rows + cols) x min(rank, rows, cols),
    when that saves at least the minimum compression rate; every other gradient whole."""
    total = 0
    for param in model.parameters():
        size = param.element_size()
        if param.dim() > 1:
            rows = param.shape[0]
            cols = param.numel() // rows
            r = min(rank, rows, cols)
            if (rows + cols) * r * POWERSGD_MIN_COMPRESSION < rows * cols:
                total += (rows + cols) * r * size
                continue
        total += param.numel() * size
    return total


def run_mode(mode: str, options: argparse.Namespace, rank: int) -> tuple[list[float], list[int]]:
    """One mode on this rank: (step times of the slower rank, bytes all-reduced per step)."""
    model = DistributedDataParallel(
        build(mode, options.rank_ratio), bucket_cap_mb=options.bucket_mb
    )
    counter = ByteCounter()
    collectives = CountingCollectives()
    if mode == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=options.powersgd_rank,
            start_powerSGD_iter=POWERSGD_START,
        )
        powersgd.dist = collectives  # type: ignore[assignment]
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    else:
        model.register_comm_hook(counter, counting_allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1000 + rank)
    times, sent = [], []
    for step in range(options.warmup_steps + options.steps):
        x = torch.randn(options.batch, 3, options.image, options.image, generator=generator)
        y = torch.randint(0, 10, (options.batch,), generator=generator)
        counter.reset()
        collectives.bytes = 0
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= options.warmup_steps:
            times.append(elapsed.item())
            sent.append(counter.bytes + collectives.bytes)
    powersgd.dist = dist  # type: ignore[assignment]
    # Both ranks drop this mode's DDP reducer (and its hook's futures) together, before the next
    # mode's DDP starts collectives or the process group ends: a reducer collected later, at
    # exit, can abort the process.
    dist.barrier()
    del model, optimizer
    gc.collect()
    return times, sent


def time_allreduce(count: int, repeats: int = 5) -> float:
    """Median seconds of one all-reduce of `count` float32 values alone (both ranks call it)."""
    buffer = torch.zeros(max(count, 1))
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return statistics.median(times)


def worker(rank: int, folder: str, options: argparse.Namespace) -> None:
    torch.set_num_threads(options.threads)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2
    )
    found: dict[str, dict[str, list[Any]]] = {m: {"times": [], "bytes": []} for m in options.modes}
    try:
        for _ in range(options.rounds):
            for mode in options.modes:
                times, sent = run_mode(mode, options, rank)
                found[mode]["times"] += times
                found[mode]["bytes"] += sent
        for mode in options.modes:
            payload = statistics.median(found[mode]["bytes"]) // 4
            found[mode]["allreduce_alone_s"] = [time_allreduce(int(payload))]
    finally:
        gc.collect()  # every DDP reducer goes before its process group
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        Path(folder, "found.json").write_text(json.dumps(found))


def closed_forms(options: argparse.Namespace) -> dict[str, dict[str, int]]:
    full = build("full", options.rank_ratio)
    plan = plan_factorization(full, options.rank_ratio)
    return {
        "full": {"params": plan.params_before, "bytes_closed_form": plan.bytes_before},
        "factorised": {"params": plan.params_after, "bytes_closed_form": plan.bytes_after},
        "powersgd": {
            "params": plan.params_before,
            "bytes_closed_form": powersgd_closed_form(full, options.powersgd_rank),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=16)
    parser.add_argument("--rank-ratio", type=float, default=0.25)
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--modes", type=lambda t: t.split(","), default=list(MODES))
    parser.add_argument("--bucket-mb", type=float, default=100.0, help="DDP bucket_cap_mb (100)")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(argv)
    if options.warmup_steps < POWERSGD_START:
        parser.error(f"--warmup-steps must be at least {POWERSGD_START} (PowerSGD starts there)")
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(worker, args=(folder, options), nprocs=2, join=True)
        found = json.loads(Path(folder, "found.json").read_text())
    expected = closed_forms(options)
    config = vars(options) | {"json": str(options.json), "load_average": os.getloadavg()}
    results: dict[str, Any] = {"config": config, "modes": {}}
    for mode in options.modes:
        sent = found[mode]["bytes"]
        results["modes"][mode] = {
            "params": expected[mode]["params"],
            "bytes_per_step": statistics.median(sent),
            "bytes_per_step_all_equal": len(set(sent)) == 1,
            "bytes_closed_form": expected[mode]["bytes_closed_form"],
            "step_ms_median": statistics.median(found[mode]["times"]) * 1e3,
            "allreduce_alone_ms": found[mode]["allreduce_alone_s"][0] * 1e3,
            "step_ms": [round(t * 1e3, 2) for t in found[mode]["times"]],
        }
    full = results["modes"].get("full")
    for mode in ("factorised", "powersgd"):
        row = results["modes"].get(mode)
        if full is None or row is None:
            continue
        row["bytes_vs_full"] = full["bytes_per_step"] / row["bytes_per_step"]
        row["speedup_vs_full"] = full["step_ms_median"] / row["step_ms_median"]
    print_table(results)
    if options.json:
        options.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


def print_table(results: dict[str, Any]) -> None:
    header = (
        f"{'mode':<11}{'params':>12}{'MB/step':>10}{'closed form':>13}{'ms/step':>10}"
        f"{'bytes x less':>14}{'speed-up':>10}{'all-reduce alone ms':>21}"
    )
    print(header)
    print("-" * len(header))
    for mode, row in results["modes"].items():
        less = f"{row['bytes_vs_full']:.2f}" if "bytes_vs_full" in row else "1.00"
        speed = f"{row['speedup_vs_full']:.2f}" if "speedup_vs_full" in row else "1.00"
        print(
            f"{mode:<11}{row['params']:>12,}{row['bytes_per_step'] / 1e6:>10.3f}"
            f"{row['bytes_closed_form'] / 1e6:>13.3f}{row['step_ms_median']:>10.1f}"
            f"{less:>14}{speed:>10}{row['allreduce_alone_ms']:>21.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
