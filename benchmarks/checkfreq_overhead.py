"""CheckFreq's overhead against no checkpointing, and the work a kill loses against epoch-boundary
checkpointing, on a CPU model.

    python benchmarks/checkfreq_overhead.py [--steps 300] [--epoch 100] [--rounds 2]
        [--width 1024] [--batch 128] [--max-overhead 5] [--dir DIR] [--json OUT]

Three configurations train the same seeded MLP (``--width`` wide, 4 layers, AdamW, a torchdata
StatefulDataLoader over synthetic data) for ``--steps`` steps, interleaved round-robin for
``--rounds`` rounds so background load falls on all alike:

  none       no checkpoints
  checkfreq  `CheckFreq` hooked on optimizer.step, overhead bound ``--max-overhead`` percent
  epoch      a synchronous torch.distributed.checkpoint save of the same objects every ``--epoch``
             steps (what a loop that checkpoints at epoch boundaries does)

For each: wall time per step, overhead against ``none`` (same round), checkpoints taken, and the
expected work lost by a SIGKILL at a uniformly random moment of the run: the steps done since the
newest checkpoint that was durable at that moment, averaged over 10,000 moments on the run's own
timeline (step end times, checkpoint commit times). CheckFreq's own figures (interval chosen,
snapshot and persist times, the stall fraction its profiler measured) are printed too.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from kernelfleet.tools.checkfreq import CheckFreq  # noqa: E402
from kernelfleet.tools.checkfreq.state import quiet_single_process  # noqa: E402


@dataclass
class Run:
    config: str
    round: int
    step_ends: list[float] = field(default_factory=list)
    """Seconds since the run's start at which each step ended."""
    commits: list[tuple[float, int]] = field(default_factory=list)
    """(seconds since start, step) at which a checkpoint became durable."""
    wall_s: float = 0.0
    checkfreq: dict[str, Any] = field(default_factory=dict)

    @property
    def per_step_ms(self) -> float:
        return self.wall_s / len(self.step_ends) * 1000

    def lost_steps(self, samples: int = 10_000) -> float:
        """Mean steps lost by a kill at a uniformly random moment of the run."""
        rng = random.Random(0)
        lost = []
        for _ in range(samples):
            t = rng.uniform(0, self.wall_s)
            done = sum(1 for end in self.step_ends if end <= t)
            saved = max((step for when, step in self.commits if when <= t), default=0)
            lost.append(done - saved)
        return statistics.fmean(lost)


def objects(width: int, batch: int, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    samples = batch * min(steps, 64)
    x = torch.randn(samples, width, generator=data)
    y = torch.randn(samples, width, generator=data)
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, width))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = StatefulDataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    return {"model": model, "optimizer": optimizer, "loader": loader}


def train(run: Run, ns: dict[str, Any], steps: int, at_step_end: Any = None) -> None:
    model, optimizer, loader = ns["model"], ns["optimizer"], ns["loader"]
    start = time.perf_counter()
    step = 0
    while step < steps:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if at_step_end is not None:
                at_step_end(step, start)
            run.step_ends.append(time.perf_counter() - start)
            if step >= steps:
                break
    run.wall_s = time.perf_counter() - start


def run_none(args: argparse.Namespace, round_: int, folder: Path) -> Run:
    run = Run("none", round_)
    train(run, objects(args.width, args.batch, args.steps), args.steps)
    return run


def run_checkfreq(args: argparse.Namespace, round_: int, folder: Path) -> Run:
    run = Run("checkfreq", round_)
    ns = objects(args.width, args.batch, args.steps)
    cf = CheckFreq(folder, namespace=ns, max_overhead=args.max_overhead / 100)
    seen: set[int] = set()

    def note_commits(step: int, start: float) -> None:
        last = cf.last_step
        if last is not None and last not in seen:
            seen.add(last)
            run.commits.append((time.perf_counter() - start, last))

    cf.attach()
    train(run, ns, args.steps, note_commits)
    cf.detach()
    status = cf.status()
    run.checkfreq = {
        "interval": status.frequency,
        "checkpoints": len(seen),
        "iter_ms": (status.iter_s or 0) * 1000,
        "snapshot_ms": (status.snapshot_s or 0) * 1000,
        "persist_ms": (status.persist_s or 0) * 1000,
        "stall_fraction": status.overhead,
        "slowdown": status.slowdown,
        "retunes": cf.tuner.retunes,
    }
    return run


def run_epoch(args: argparse.Namespace, round_: int, folder: Path) -> Run:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    run = Run("epoch", round_)
    ns = objects(args.width, args.batch, args.steps)
    quiet_single_process()

    def save_at_epoch_end(step: int, start: float) -> None:
        if step % args.epoch == 0:
            model_state, optim_state = get_state_dict(ns["model"], ns["optimizer"])
            state = {"model": model_state, "optim": optim_state}
            dcp.save(state, checkpoint_id=str(folder / f"epoch-{step}"), no_dist=True)
            run.commits.append((time.perf_counter() - start, step))

    train(run, ns, args.steps, save_at_epoch_end)
    return run


CONFIGS = {"none": run_none, "checkfreq": run_checkfreq, "epoch": run_epoch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--epoch", type=int, default=100, help="steps per epoch checkpoint")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-overhead", type=float, default=5.0, help="percent")
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="checkfreq-bench-", dir=args.dir))
    params = sum(p.numel() for p in objects(args.width, args.batch, 1)["model"].parameters())
    print(
        f"model: {params / 1e6:.1f} M parameters (checkpoint ~{params * 12 / 1e6:.0f} MB with "
        f"AdamW's state), {args.steps} steps, epoch checkpoint every {args.epoch} steps, "
        f"torch threads {torch.get_num_threads()}, checkpoints in {base}"
    )
    train(Run("warm-up", -1), objects(args.width, args.batch, 10), 10)  # first-call costs
    runs: list[Run] = []
    try:
        for round_ in range(args.rounds):
            for name, config in CONFIGS.items():
                folder = base / f"{name}-{round_}"
                runs.append(config(args, round_, folder))
                shutil.rmtree(folder, ignore_errors=True)
                last = runs[-1]
                print(f"round {round_} {name:9s} {last.per_step_ms:7.1f} ms/step", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures = summarise(runs, args)
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "runs": [asdict(r) for r in runs]}))
    return 0


def summarise(runs: list[Run], args: argparse.Namespace) -> dict[str, Any]:
    baseline = {r.round: r.wall_s for r in runs if r.config == "none"}
    figures: dict[str, Any] = {}
    print("\nconfig      ms/step  overhead vs none  checkpoints  lost steps after a random kill")
    for name in CONFIGS:
        mine = [r for r in runs if r.config == name]
        overhead = statistics.median(r.wall_s / baseline[r.round] - 1 for r in mine)
        lost = statistics.median(r.lost_steps() for r in mine)
        per_step = statistics.median(r.per_step_ms for r in mine)
        count = statistics.median(len(r.commits) for r in mine)
        figures[name] = {"ms_per_step": per_step, "overhead": overhead, "lost_steps": lost,
                         "checkpoints": count}  # fmt: skip
        print(f"{name:9s} {per_step:9.1f}  {overhead:+15.1%}  {count:11.0f}  {lost:10.1f} "
              f"({lost * per_step / 1000:.1f} s of training)")  # fmt: skip
    for r in runs:
        if r.config == "checkfreq":
            c = r.checkfreq
            print(
                f"checkfreq round {r.round}: every {c['interval']} steps, {c['checkpoints']} "
                f"checkpoints, iteration {c['iter_ms']:.0f} ms, snapshot {c['snapshot_ms']:.0f} "
                f"ms, persist {c['persist_ms']:.0f} ms, stall {c['stall_fraction']:.1%} of "
                f"training time (bound {args.max_overhead:.1f}%), slowdown against its quiet "
                f"steps {c['slowdown']:.1%}, {c['retunes']} retunes"
            )
    return figures


if __name__ == "__main__":
    sys.exit(main())
