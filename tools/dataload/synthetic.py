"""A staged map-style dataset with synthetic costs: fetching an item waits (storage latency),
preparing it computes (decode). For demonstrations, benchmarks and tests of the data path."""

from __future__ import annotations

import time
from typing import Any


class SyntheticDataset:
    """`items` items of `item_bytes` bytes each. ``fetch(i)`` sleeps `fetch_s` and returns the
    item's raw bytes (deterministic in `i`); ``prepare(raw)`` spins the CPU for `decode_s` and
    returns a float tensor of the bytes (with the label ``i % 10``). ``dataset[i]`` is
    ``prepare(fetch(i))``: a staged dataset in the sense of `analyze`."""

    def __init__(
        self, items: int, item_bytes: int = 1024, fetch_s: float = 0.0, decode_s: float = 0.0
    ) -> None:
        if items < 1 or item_bytes < 1 or fetch_s < 0 or decode_s < 0:
            raise ValueError("a synthetic dataset has items of bytes, and no negative costs")
        self.items = items
        self.item_bytes = item_bytes
        self.fetch_s = fetch_s
        self.decode_s = decode_s
        self.cache_key = f"{items}x{item_bytes}"

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> Any:
        return self.prepare(self.fetch(index))

    def fetch(self, index: int) -> tuple[int, bytes]:
        if not 0 <= index < self.items:
            raise IndexError(index)
        if self.fetch_s:
            time.sleep(self.fetch_s)
        return index, bytes((index + k) % 251 for k in range(self.item_bytes))

    def prepare(self, raw: tuple[int, bytes]) -> Any:
        import torch

        index, data = raw
        deadline = time.perf_counter() + self.decode_s
        while time.perf_counter() < deadline:
            pass
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).float() / 255, index % 10
