"""Epoch time with no cache, an LRU cache and a MinIO cache, at a few sizes (CoorDL's MinIO).

    python benchmarks/dataload_cache.py [--items 400] [--item-bytes 16384] [--fetch-ms 2]
                                        [--epochs 3] [--sizes 25,50,75,100] [--workers 0]
                                        [--json OUT]

A `SyntheticDataset` whose fetch sleeps ``--fetch-ms`` per item (storage latency) is read for
``--epochs`` epochs in a fresh shuffled order each, as a training loop reads it: each item's raw
bytes through the cache (a miss fetches), then prepared. The cache holds ``--sizes`` percent of
the dataset's raw bytes. Reported per policy and size: the mean epoch time and hits per epoch
over the epochs after the first (the cache warm), and what the what-if model predicts for
MinIO (uncached share times the no-cache fetch time). MinIO's hits equal its capacity exactly;
LRU's fall below it for every size under the whole dataset.

With ``--workers N`` the items are read by N persistent ``DataLoader`` workers: they share the
one MinIO store (shared memory) but each keeps an LRU cache of its own, as per-process caches
are; their hits are not counted ("-"), only the epoch time.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kernelfleet.tools.dataload.cache import CachedDataset, MinioCache, drop_cache
from kernelfleet.tools.dataload.lru import LruCache
from kernelfleet.tools.dataload.store import overhead_bytes
from kernelfleet.tools.dataload.synthetic import SyntheticDataset


class RawItems:
    """The dataset's fetch stage as a map-style dataset: what CoorDL caches."""

    def __init__(self, dataset: SyntheticDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset.fetch(index)


class EpochOrder:
    """A sampler whose order the benchmark sets before each epoch (read in the main process,
    so persistent loader workers follow it)."""

    def __init__(self, items: int) -> None:
        self.order = list(range(items))

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.order))

    def __len__(self) -> int:
        return len(self.order)


def run_epochs(
    dataset: SyntheticDataset, source: Any, epochs: int, seed: int, workers: int
) -> list[tuple[float, int | None]]:
    """(seconds, hits) of each epoch reading every item of `source` and preparing it, in this
    process or through `workers` persistent loader workers (whose hits this process cannot
    count: None)."""
    sampler = EpochOrder(len(dataset))
    rng = random.Random(seed)
    reads: Iterable[Any] = ()
    if workers:
        from torch.utils.data import DataLoader

        reads = DataLoader(
            source, batch_size=None, sampler=sampler, num_workers=workers,
            persistent_workers=True, collate_fn=_as_is,
        )  # fmt: skip
    results: list[tuple[float, int | None]] = []
    for _ in range(epochs):
        rng.shuffle(sampler.order)
        start = time.perf_counter()
        for raw in reads if workers else (source[index] for index in sampler):
            dataset.prepare(raw)
        seconds = time.perf_counter() - start
        hits = source.reset_counts().hits if isinstance(source, CachedDataset) else 0
        results.append((seconds, None if workers else hits))
    return results


def _mean_hits(epochs: list[tuple[float, int | None]]) -> float | None:
    counted = [hits for _, hits in epochs if hits is not None]
    return statistics.mean(counted) if counted else None


def _as_is(item: Any) -> Any:
    return item


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--item-bytes", type=int, default=16384)
    parser.add_argument("--fetch-ms", type=float, default=2.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sizes", default="25,50,75,100", help="cache sizes, percent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="persistent loader workers")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    dataset = SyntheticDataset(args.items, args.item_bytes, fetch_s=args.fetch_ms / 1e3)
    raw = RawItems(dataset)
    # the last item pickles longest (its index takes the most bytes): size caches for it
    item_bytes = len(pickle.dumps(raw[args.items - 1], protocol=pickle.HIGHEST_PROTOCOL))
    warm = slice(1, None)

    rows: list[dict[str, Any]] = []
    plain = run_epochs(dataset, raw, args.epochs, args.seed, args.workers)
    none_s = statistics.mean(s for s, _ in plain[warm])
    rows.append({"policy": "none", "percent": 0, "capacity": 0, "epoch_s": none_s, "hits": 0})
    for percent in (int(p) for p in args.sizes.split(",")):
        capacity = args.items * percent // 100
        name = f"bench-{uuid.uuid4().hex[:12]}"
        minio = MinioCache(raw, overhead_bytes(args.items) + capacity * item_bytes, name=name)
        predicted = none_s * (1 - capacity / args.items)
        try:
            for policy, cache in (("LRU", LruCache(raw, capacity * item_bytes)), ("MinIO", minio)):
                epochs = run_epochs(dataset, cache, args.epochs, args.seed, args.workers)
                rows.append({
                    "policy": policy,
                    "percent": percent,
                    "capacity": capacity,
                    "epoch_s": statistics.mean(s for s, _ in epochs[warm]),
                    "hits": _mean_hits(epochs[warm]),
                    "predicted_s": predicted if policy == "MinIO" else None,
                })  # fmt: skip
        finally:
            minio.close()
            drop_cache(name)

    print(
        f"{args.items} items of {item_bytes} bytes, fetch {args.fetch_ms} ms per item, "
        f"shuffled, {args.workers or 'no'} loader workers; mean over epochs 2-{args.epochs}"
    )
    print(
        f"{'policy':<7}{'cache':>7}{'capacity':>10}{'hits/epoch':>12}{'epoch s':>10}{'model s':>10}"
    )
    for row in rows:
        model = f"{row['predicted_s']:.3f}" if row.get("predicted_s") is not None else ""
        hits = "-" if row["hits"] is None else f"{row['hits']:.1f}"
        print(
            f"{row['policy']:<7}{row['percent']:>6}%{row['capacity']:>10}{hits:>12}"
            f"{row['epoch_s']:>10.3f}{model:>10}"
        )
    if args.json:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": None}, "rows": rows}))


if __name__ == "__main__":
    main()
