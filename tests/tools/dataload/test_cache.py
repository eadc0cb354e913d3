"""MinIO against LRU: MinIO's hits per epoch equal its capacity exactly once warm, LRU's fall
below for every cache smaller than the dataset; the shared store across processes; refusals."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernelfleet
from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.cache import (
    CachedDataset,
    MinioCache,
    dataset_identity,
    drop_cache,
    segment_name,
)
from kernelfleet.tools.dataload.lru import LruCache
from kernelfleet.tools.dataload.store import (
    CacheTooLarge,
    SharedItemStore,
    free_shared_memory,
    overhead_bytes,
)

REPO_ROOT = Path(kernelfleet.__file__).resolve().parent.parent
ITEMS = 200
DATASET = [bytes([index % 256]) * 500 + index.to_bytes(4, "little") for index in range(ITEMS)]
ITEM_BYTES = len(pickle.dumps(DATASET[0], protocol=pickle.HIGHEST_PROTOCOL))


def minio_size(capacity_items: int, items: int = ITEMS) -> int:
    """The size of a MinIO cache that holds exactly `capacity_items` of `DATASET`'s items."""
    return overhead_bytes(items) + capacity_items * ITEM_BYTES


def epoch_hits(cache: CachedDataset, epochs: int, *, shuffled: bool) -> list[int]:
    """Hits in each of `epochs` epochs over every item, checking each item read."""
    order = list(range(len(cache)))
    rng = random.Random(7)
    hits = []
    for _ in range(epochs):
        if shuffled:
            rng.shuffle(order)
        for index in order:
            assert cache[index] == DATASET[index]
        counts = cache.reset_counts()
        assert counts.hits + counts.misses == len(cache)
        hits.append(counts.hits)
    return hits


@pytest.mark.parametrize("shuffled", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("capacity", [1, 20, 100, 180, 199])
def test_minio_hits_equal_its_capacity_while_lru_falls_below(
    cache_name: str, capacity: int, shuffled: bool
) -> None:
    minio = MinioCache(DATASET, minio_size(capacity), name=cache_name)
    lru = LruCache(DATASET, capacity * ITEM_BYTES)
    try:
        assert epoch_hits(minio, 4, shuffled=shuffled) == [0, capacity, capacity, capacity]
        assert minio.cached_items == capacity
        lru_hits = epoch_hits(lru, 4, shuffled=shuffled)
        assert lru.cached_items == capacity
        assert lru_hits[0] == 0
        assert all(hits < capacity for hits in lru_hits[1:]), lru_hits
        if not shuffled:  # a sequential scan evicts each item just before it comes round
            assert lru_hits == [0, 0, 0, 0]
    finally:
        minio.close()


def test_a_cache_as_large_as_the_dataset_hits_everything_either_way(cache_name: str) -> None:
    minio = MinioCache(DATASET, minio_size(ITEMS), name=cache_name)
    lru = LruCache(DATASET, ITEMS * ITEM_BYTES)
    try:
        assert epoch_hits(minio, 2, shuffled=True) == [0, ITEMS]
        assert epoch_hits(lru, 2, shuffled=True) == [0, ITEMS]
    finally:
        minio.close()


SECOND_PROCESS = """
import json, sys
from kernelfleet.tools.dataload.cache import MinioCache

class Elsewhere:
    '''The same dataset's length, but every item fetched here (a miss) is None.'''
    def __len__(self):
        return {items}
    def __getitem__(self, index):
        return None

cache = MinioCache(Elsewhere(), {size}, name={name!r})
items = [cache[index] for index in range(len(cache))]
json.dump({{"hits": cache.counts.hits, "served": [i for i, x in enumerate(items) if x is not None],
           "payload": [x.hex() for x in items if x is not None]}}, sys.stdout)
"""


def test_a_second_process_attaching_sees_the_first_ones_items_as_hits(cache_name: str) -> None:
    capacity = 50
    first = MinioCache(DATASET, minio_size(capacity), name=cache_name)
    try:
        order = list(range(ITEMS))
        random.Random(1).shuffle(order)
        for index in order:
            first[index]
        script = SECOND_PROCESS.format(items=ITEMS, size=minio_size(capacity), name=cache_name)
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        seen = json.loads(done.stdout)
        assert seen["hits"] == capacity
        assert seen["served"] == sorted(order[:capacity])
        assert seen["payload"] == [DATASET[i].hex() for i in seen["served"]]
    finally:
        first.close()


def test_concurrent_fillers_in_loader_workers_fill_it_exactly(cache_name: str) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    capacity = 120
    cache = MinioCache(DATASET, minio_size(capacity), name=cache_name)
    try:
        loader = torch_data.DataLoader(
            cache, batch_size=None, shuffle=True, num_workers=2, collate_fn=lambda item: item
        )
        seen = sorted(loader, key=lambda item: item[-4:])  # each worker fills the store
        assert seen == sorted(DATASET, key=lambda item: item[-4:])
        assert cache.cached_items == capacity
        assert cache.store.state().used_bytes == capacity * ITEM_BYTES
        assert epoch_hits(cache, 1, shuffled=True) == [capacity]
    finally:
        cache.close()


def test_a_cache_travels_to_another_process_by_name(cache_name: str) -> None:
    cache = MinioCache(DATASET, minio_size(10), name=cache_name)
    try:
        for index in range(10):
            cache[index]
        copy = pickle.loads(pickle.dumps(cache))
        assert copy.store.name == segment_name(cache_name)
        assert epoch_hits(copy, 1, shuffled=False) == [10]
        copy.close()
    finally:
        cache.close()


def test_a_cache_larger_than_free_shared_memory_is_refused_with_both_sizes(
    cache_name: str,
) -> None:
    free = free_shared_memory()
    asked = free + 10**9
    with pytest.raises(CacheTooLarge) as refused:
        MinioCache(DATASET, asked, name=cache_name)
    assert f"({asked} bytes)" in refused.value.message
    assert "larger than the free shared memory" in refused.value.message
    free_bytes = int(refused.value.message.rsplit("(", 1)[1].split()[0])
    assert abs(free_bytes - free) < 10**8  # what was free then, give or take other writers
    assert not drop_cache(cache_name)  # nothing was made


def test_other_refusals(cache_name: str) -> None:
    with pytest.raises(InvalidRequest, match="cannot even hold the index of 200 items"):
        MinioCache(DATASET, overhead_bytes(ITEMS), name=cache_name)
    cache = MinioCache(DATASET, minio_size(5), name=cache_name)
    try:
        with pytest.raises(InvalidRequest, match="holds a dataset of 200 items, not 10"):
            MinioCache(DATASET[:10], minio_size(5), name=cache_name)
        with pytest.raises(IndexError):
            cache[ITEMS]
        with pytest.raises(InvalidRequest, match="no cache named"):
            SharedItemStore.attach(segment_name(cache_name + "-absent"))
    finally:
        cache.close()
    assert drop_cache(cache_name)
    assert not drop_cache(cache_name)


def test_an_unnamed_cache_is_named_by_the_datasets_identity() -> None:
    assert dataset_identity(DATASET) == dataset_identity(list(DATASET))
    assert dataset_identity(DATASET) != dataset_identity(DATASET[:10])
    assert dataset_identity(DATASET).startswith("list-")


ANOTHER_USER = """
from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.cache import MinioCache
try:
    MinioCache(list(range({items})), {size}, name={name!r})
except InvalidRequest as error:
    print(error.message)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user")
def test_another_user_cannot_open_the_cache(cache_name: str) -> None:
    cache = MinioCache(DATASET, minio_size(5), name=cache_name)
    try:
        uid = 2**24 + 4242  # a kernel's kind of uid (docs/security.md), not a system account
        script = ANOTHER_USER.format(items=ITEMS, size=minio_size(5), name=cache_name)
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            user=uid,
            group=uid,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert f"the cache {segment_name(cache_name)!r} belongs to another user" in done.stdout
    finally:
        cache.close()
