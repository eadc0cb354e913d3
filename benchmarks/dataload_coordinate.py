"""Coordinated against independent data preparation for k consumers on one host (CoorDL).

    python benchmarks/dataload_coordinate.py [--consumers 2,4] [--items 512] [--batch 16]
        [--cost-ms 4] [--decode cpu|sleep] [--workers 2] [--epochs 2] [--rounds 2] [--json OUT]

Each of k consumer processes (spawned) iterates ``--epochs`` epochs of an equal, seeded
DataLoader over ``--items`` samples (3x64x64 float images and a label). Each ``__getitem__`` costs
``--cost-ms`` of synthetic decoding: CPU time spent in a busy loop (``cpu``, what decoding and
augmenting images cost) or a sleep (``sleep``, a fetch that waits without using a CPU). The
loader has ``--workers`` worker processes (forked).

  independent  each consumer iterates its own loader: every sample is prepared k times
  coordinated  each consumer iterates ``coordinate(loader, group, consumers=k)``: one producer
               (with the loader's workers) prepares every sample once for the k

The time of an epoch is the slowest consumer's, from the moment all k are ready (for
``coordinated``, when the group has formed) to its last batch; each configuration runs once a
round, interleaved, for ``--rounds`` rounds, and the median over rounds of the *last* epoch is
reported (the first coordinated epoch also pays for the producer's start). The speed-up is
independent over coordinated. Wall times depend on whatever else the host runs; so the CPU
seconds the same epoch cost all processes involved (consumers and their workers; the producer,
its workers and the coordinator) are reported too, with their ratio: the work coordination
saved. The preparation count is the producer's count of ``__getitem__`` calls (coordinated) and
k times the items per epoch (independent).

The consumers do nothing with a batch but take it: this measures preparation alone, the case
where the k jobs' training steps (on GPUs) wait for their data.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernelfleet.tools.dataload.coordinate import coordinate


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """``items`` seeded 3x64x64 images, each costing ``cost_s`` to 'decode'."""

    def __init__(self, items: int, cost_s: float, decode: str) -> None:
        self.items = items
        self.cost_s = cost_s
        self.decode = decode

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.decode == "sleep":
            time.sleep(self.cost_s)
        else:
            end = time.thread_time() + self.cost_s
            while time.thread_time() < end:
                pass
        image = torch.Generator().manual_seed(index)
        return torch.rand(3, 64, 64, generator=image), index % 10


@dataclass(frozen=True)
class Config:
    items: int
    batch: int
    cost_ms: float
    decode: str
    workers: int
    epochs: int


def make_loader(config: Config) -> DataLoader[Any]:
    """The loader; its workers are forked in both modes (in a spawned consumer, torch's default
    would spawn them, each re-importing this script and torch every epoch)."""
    dataset = SyntheticImages(config.items, config.cost_ms / 1000, config.decode)
    return DataLoader(dataset, batch_size=config.batch, shuffle=True, num_workers=config.workers,
                      generator=torch.Generator().manual_seed(0),
                      multiprocessing_context="fork" if config.workers else None)  # fmt: skip


def own_cpu_s() -> float:
    """CPU seconds of this process and of its reaped children (the loader's workers)."""
    me, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds of another process of ours and of its reaped children, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def consumer(config: Config, mode: str, group: str, k: int, ready: Any, out: Any) -> None:
    """One consumer process: its epoch times, CPU time and the producer's count into ``out``."""
    torch.set_num_threads(1)
    loader: Any = make_loader(config)
    if mode == "coordinated":
        loader = coordinate(loader, group, consumers=k, timeout=300)
    shared = [loader.producer_pid, loader.coordinator_pid] if mode == "coordinated" else []
    ready.wait()
    epochs = []
    for _ in range(config.epochs):
        start, cpu, shared_cpu = time.monotonic(), own_cpu_s(), sum(map(process_cpu_s, shared))
        batches = sum(1 for _ in loader)
        epochs.append({"start": start, "end": time.monotonic(), "batches": batches,
                       "cpu_s": own_cpu_s() - cpu,
                       "shared_cpu": (shared_cpu, sum(map(process_cpu_s, shared)))})  # fmt: skip
    prepared = loader.stats.items_prepared if mode == "coordinated" else None
    out.put({"epochs": epochs, "items_prepared": prepared})
    if mode == "coordinated":
        loader.close()


def run(config: Config, mode: str, k: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(k), context.Queue()
    group = f"bench-{uuid.uuid4().hex[:8]}"
    processes = [context.Process(target=consumer, args=(config, mode, group, k, ready, out))
                 for _ in range(k)]  # fmt: skip
    for process in processes:
        process.start()
    reports = [out.get(timeout=900) for _ in processes]
    for process in processes:
        process.join()
    epoch_s, cpu_s = [], []
    for e in range(config.epochs):
        marks = [r["epochs"][e] for r in reports]
        epoch_s.append(max(m["end"] for m in marks) - min(m["start"] for m in marks))
        # the producer's and coordinator's CPU over the union of the consumers' epochs
        shared = max(m["shared_cpu"][1] for m in marks) - min(m["shared_cpu"][0] for m in marks)
        cpu_s.append(sum(m["cpu_s"] for m in marks) + shared)
    prepared = reports[0]["items_prepared"]
    return {
        "epoch_s": epoch_s,
        "cpu_s": cpu_s,
        "batches_per_epoch": reports[0]["epochs"][0]["batches"],
        "items_prepared": k * config.items * config.epochs if prepared is None else prepared,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", default="2,4")
    parser.add_argument("--items", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cost-ms", type=float, default=4.0)
    parser.add_argument("--decode", choices=["cpu", "sleep"], default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = Config(args.items, args.batch, args.cost_ms, args.decode, args.workers, args.epochs)
    ks = [int(k) for k in args.consumers.split(",")]
    load_before = os.getloadavg()
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for k in ks:
            for mode in ("independent", "coordinated"):
                runs.setdefault((k, mode), []).append(run(config, mode, k))
    results = []
    modes = ("independent", "coordinated")
    print(f"{'k':>2}  {'mode':<12} {'last epoch s':>12} {'CPU s':>12} {'items prepared':>15}"
          f"  {'speed-up':>8}  {'CPU ratio':>9}")  # fmt: skip
    for k in ks:
        last = {m: statistics.median(r["epoch_s"][-1] for r in runs[(k, m)]) for m in modes}
        cpu = {m: statistics.median(r["cpu_s"][-1] for r in runs[(k, m)]) for m in modes}
        speedup = last["independent"] / last["coordinated"]
        cpu_ratio = cpu["independent"] / cpu["coordinated"]
        for mode in modes:
            gain, saved = (speedup, cpu_ratio) if mode == "coordinated" else (1.0, 1.0)
            prepared = runs[(k, mode)][0]["items_prepared"]
            print(f"{k:>2}  {mode:<12} {last[mode]:>12.3f} {cpu[mode]:>12.3f} {prepared:>15}"
                  f"  {gain:>7.2f}x  {saved:>8.2f}x")  # fmt: skip
            results.append({"consumers": k, "mode": mode, "epoch_s_last_median": last[mode],
                            "cpu_s_last_median": cpu[mode], "speedup": gain,
                            "cpu_ratio": saved, "runs": runs[(k, mode)]})  # fmt: skip
    machine = {"cpus": os.cpu_count(), "load_average_before": load_before,
               "load_average_after": os.getloadavg()}  # fmt: skip
    report = {
        "config": asdict(config),
        "rounds": args.rounds,
        "machine": machine,
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
