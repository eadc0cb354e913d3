"""An LRU cache of a dataset's items, the policy MinIO is compared with (the OS page cache's,
roughly). Same interface as `cache.MinioCache`, kept in this process only."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from kernelfleet.tools.dataload.cache import CachedDataset


class LruCache(CachedDataset):
    """Least-recently-used over `dataset`, holding at most `capacity_bytes` of pickled items:
    a miss is admitted after evicting the least recently used items until it fits (an item
    larger than the whole cache is not admitted)."""

    def __init__(self, dataset: Any, capacity_bytes: int) -> None:
        super().__init__(dataset)
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._items: OrderedDict[int, bytes] = OrderedDict()

    @property
    def cached_items(self) -> int:
        return len(self._items)

    def _lookup(self, index: int) -> bytes | None:
        blob = self._items.get(index)
        if blob is not None:
            self._items.move_to_end(index)
        return blob

    def _admit(self, index: int, blob: bytes) -> None:
        if len(blob) > self.capacity_bytes:
            return
        while self.used_bytes + len(blob) > self.capacity_bytes:
            _, evicted = self._items.popitem(last=False)
            self.used_bytes -= len(evicted)
        self._items[index] = blob
        self.used_bytes += len(blob)
