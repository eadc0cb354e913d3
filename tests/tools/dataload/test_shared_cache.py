"""A MinIO cache shared by processes of different users through the host agent's cache broker
(in-process here; the live test in test_magics.py goes through a fleet's agent)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelfleet.errors import InvalidRequest  # noqa: E402
from kernelfleet.kernels.agent import cache_broker  # noqa: E402
from kernelfleet.kernels.agent.cache_broker import CacheBroker, data_start  # noqa: E402
from kernelfleet.privileges import kernel_uid  # noqa: E402
from kernelfleet.tools.dataload import shared_cache  # noqa: E402
from kernelfleet.tools.dataload.cache import CacheCounts  # noqa: E402
from kernelfleet.tools.dataload.share import new_key  # noqa: E402
from kernelfleet.tools.dataload.shared_cache import SharedCache, drop_shared_cache  # noqa: E402
from kernelfleet.tools.dataload.synthetic import SyntheticDataset  # noqa: E402
from kernelfleet.tools.dataload.tensor_format import encode  # noqa: E402

PEER = Path(__file__).with_name("shared_cache_peer.py")
REPO = Path(__file__).resolve().parents[3]
AS_ROOT = os.geteuid() == 0
ITEMS = 20


@pytest.fixture
def broker() -> Iterator[CacheBroker]:
    """A broker in a folder other users may traverse (as the agent's state dir)."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-broker-"))
    folder.chmod(0o711)
    broker = CacheBroker(folder / "cache-broker.sock")
    broker.start()
    yield broker
    broker.stop()
    shutil.rmtree(folder, ignore_errors=True)


def size_for(items: int) -> int:
    """A cache size that holds exactly ``items`` of the peers' items."""
    item = SyntheticDataset(ITEMS, item_bytes=64)[0]
    return data_start(ITEMS) + items * -(-len(encode(item)) // 64) * 64


def peer(broker: CacheBroker, name: str, key: str, size: int, epochs: int, who: str) -> Any:
    options: dict[str, Any] = {}
    if AS_ROOT:
        uid = kernel_uid(f"shared-cache-test-{who}")
        options = {"user": uid, "group": uid, "extra_groups": []}
    done = subprocess.run(
        [sys.executable, str(PEER), str(broker.path), key, name, str(size), str(epochs)],
        capture_output=True, text=True, timeout=120, cwd="/tmp",
        env={**os.environ, "PYTHONPATH": str(REPO)}, **options,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_users_share_one_cache_with_exact_minio_hits(broker: CacheBroker) -> None:
    name, key, size = f"test-{uuid.uuid4().hex[:8]}", new_key(), size_for(8)
    first = peer(broker, name, key, size, 2, "a")
    # the first fills 8 items (the capacity) and then hits exactly those
    assert first["counts"] == [[0, ITEMS], [8, ITEMS - 8]]
    second = peer(broker, name, key, size, 1, "b")
    assert second["counts"] == [[8, ITEMS - 8]]  # another user: hits on what the first filled
    assert first["same"]
    assert second["same"]
    if AS_ROOT:
        assert first["uid"] != second["uid"]
    wrong = peer(broker, name, new_key(), size, 1, "c")
    assert wrong == {
        "error": f"the shared cache {name!r} refused this share key: it is not the key the "
        "cache was made with"
    }


def test_a_cache_too_large_for_free_shared_memory_is_refused_with_sizes(
    broker: CacheBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_broker, "free_shared_memory", lambda: 10**9)
    with pytest.raises(InvalidRequest) as refused:
        SharedCache(list(range(4)), 10**14, new_key(), name="huge", broker=str(broker.path))
    assert refused.value.message == (
        "a cache of 100000.00 GB (100000000000000 bytes) is larger than the free shared memory: "
        "1.00 GB (1000000000 bytes) (free in /dev/shm, less 0.00 MB (0 bytes) held by this "
        "host's shared caches)"
    )


def test_without_a_broker_it_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shared_cache.BROKER_ENV, raising=False)
    with pytest.raises(InvalidRequest, match="no cache broker: KERNELFLEET_CACHE_BROKER"):
        SharedCache(list(range(4)), 10**6, new_key())


def test_loader_workers_fill_it_through_their_own_connections(broker: CacheBroker) -> None:
    dataset = SyntheticDataset(ITEMS, item_bytes=64)
    cache = SharedCache(dataset, size_for(ITEMS), new_key(), name="workers",
                        broker=str(broker.path))  # fmt: skip
    loader = torch.utils.data.DataLoader(cache, batch_size=4, num_workers=2)
    first = [batch for batch in loader]
    assert cache.cached_items == ITEMS  # the forked workers' misses reached the broker
    assert [label.tolist() for _, label in first] == [
        [i % 10 for i in range(b, b + 4)] for b in range(0, ITEMS, 4)
    ]
    assert all(cache[i][1] == i % 10 for i in range(ITEMS))
    assert cache.reset_counts().hits == ITEMS
    cache.close()


def test_an_item_the_format_cannot_carry_is_refused_naming_it(broker: CacheBroker) -> None:
    cache = SharedCache([{"p": Path("/x")}], 10**5, new_key(), name="paths",
                        broker=str(broker.path))  # fmt: skip
    with pytest.raises(TypeError, match=r"item\['p'\]: a PosixPath cannot be shared"):
        cache[0]
    cache.close()


def test_a_key_holder_drops_it_and_a_stranger_cannot(broker: CacheBroker) -> None:
    key = new_key()
    cache = SharedCache(list(range(4)), 10**5, key, name="dropped", broker=str(broker.path))
    _ = [cache[i] for i in range(4)]
    with pytest.raises(InvalidRequest, match="refused this share key"):
        drop_shared_cache("dropped", new_key(), broker=str(broker.path))
    assert drop_shared_cache("dropped", key, broker=str(broker.path))
    assert [cache[i] for i in range(4)] == list(range(4))  # its mapping outlives the drop
    assert cache.counts.hits == 4
    assert not drop_shared_cache("dropped", key, broker=str(broker.path))
    again = SharedCache(list(range(4)), 10**5, key, name="dropped", broker=str(broker.path))
    assert again.cached_items == 0  # a new, empty cache of that name
    again.close()
    cache.close()


def test_when_the_broker_is_gone_it_still_serves_and_loses_nothing(broker: CacheBroker) -> None:
    cache = SharedCache(list(range(6)), 10**5, new_key(), name="orphan", broker=str(broker.path))
    assert [cache[i] for i in range(3)] == [0, 1, 2]
    broker.stop()  # the agent stopped: the mapping stays, filling stops
    assert [cache[i] for i in range(6)] == list(range(6))
    assert cache.reset_counts() == CacheCounts(hits=3, misses=6)
    cache.close()
