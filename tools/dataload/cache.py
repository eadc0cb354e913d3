"""MinIO (CoorDL): a cache of a map-style dataset's items that fills once and never evicts.

`CachedDataset` is the interface `MinioCache` and `lru.LruCache` share: indexing returns the
dataset's item, from the cache when it is there (a hit) and from the wrapped dataset otherwise
(a miss, after which the cache may keep it); `counts` says how many of each since
`reset_counts`. Items are kept as their pickled bytes (tensors pickle as torch.save would),
so what is cached is exactly what a fetch from storage would have returned, in bytes.

Why MinIO: a training epoch touches every item exactly once in a random order, so recency
says nothing about the next access; any item in the cache is as good as any other. MinIO keeps
the first items that fit and never replaces them, so once warm every epoch has exactly as many
hits as the cache holds items; LRU evicts items just before they are needed and gets fewer
(none at all under a sequential order, for any cache smaller than the dataset).

`MinioCache` keeps its items in a `store.SharedItemStore`, a shared-memory segment named from
the cache's name (or the dataset's identity): every kernel, job and ``DataLoader`` worker of
one user on the host that opens the same name shares one copy (`store` says why not across
users). Counts are per process.
"""

from __future__ import annotations

import hashlib
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from kernelfleet.tools.dataload.sizes import format_size
from kernelfleet.tools.dataload.store import SharedItemStore

SEGMENT_PREFIX = "kernelfleet-minio-"


@dataclass(frozen=True)
class CacheCounts:
    """Accesses since the counts were last reset."""

    hits: int
    misses: int


class CachedDataset(ABC):
    """A map-style dataset in front of another (see the module docstring)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._hits = 0
        self._misses = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        blob = self._lookup(index)
        if blob is not None:
            self._hits += 1
            return self._decode(blob)
        self._misses += 1
        item = self.dataset[index]
        self._admit(index, self._encode(item))
        return item

    def _encode(self, item: Any) -> bytes:
        """An item as the cache keeps it: pickled (a cache of one user's processes)."""
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)

    def _decode(self, blob: bytes) -> Any:
        return pickle.loads(blob)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy in another process (a loader worker) counts its own accesses from zero."""
        self.__dict__.update(state, _hits=0, _misses=0)

    @property
    def counts(self) -> CacheCounts:
        return CacheCounts(self._hits, self._misses)

    def reset_counts(self) -> CacheCounts:
        """The counts so far, which then start again from zero (call it at each epoch)."""
        counts = self.counts
        self._hits = self._misses = 0
        return counts

    @property
    @abstractmethod
    def cached_items(self) -> int:
        """How many items the cache holds now."""

    @abstractmethod
    def _lookup(self, index: int) -> bytes | None:
        """Item `index`'s bytes when cached (a hit), else None."""

    @abstractmethod
    def _admit(self, index: int, blob: bytes) -> None:
        """Called after a miss with the item's bytes: keep them, or not."""


class MinioCache(CachedDataset):
    """MinIO over `dataset`, its items in the shared store `name` (created with `size_bytes`
    when it does not exist yet; see `store.SharedItemStore.open` for what it refuses)."""

    def __init__(self, dataset: Any, size_bytes: int, name: str | None = None) -> None:
        super().__init__(dataset)
        self.name = name or dataset_identity(dataset)
        self.store = SharedItemStore.open(segment_name(self.name), size_bytes, len(dataset))

    @property
    def cached_items(self) -> int:
        return self.store.state().stored

    def _lookup(self, index: int) -> bytes | None:
        return self.store.get(index)

    def _admit(self, index: int, blob: bytes) -> None:
        self.store.put(index, blob)

    def close(self) -> None:
        """Detach this process from the store (which stays; `drop_cache` removes it)."""
        self.store.close()

    def __repr__(self) -> str:
        state = self.store.state()
        return (
            f"MinIO cache {self.name!r} (shared memory {self.store.name}): {state.stored} of "
            f"{state.items} items, {format_size(state.used_bytes)} of "
            f"{format_size(state.capacity_bytes)} used"
        )


def segment_name(name: str) -> str:
    """The shared-memory segment of the cache `name`."""
    return SEGMENT_PREFIX + name


def dataset_identity(dataset: Any) -> str:
    """A name for `dataset` when none is given: its class, its length and its ``cache_key``
    attribute when it has one, hashed. Two different datasets of one class and length share a
    name unless their ``cache_key`` differs: name such caches explicitly."""
    kind = type(dataset)
    cache_key = getattr(dataset, "cache_key", "")
    key = f"{kind.__module__}.{kind.__qualname__}:{len(dataset)}:{cache_key}"
    return f"{kind.__name__.lower()}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def drop_cache(name: str) -> bool:
    """Remove the cache `name` from the host; False when there was none."""
    from kernelfleet.tools.dataload.store import drop

    return drop(segment_name(name))
