"""The object store: content addressing, idempotence, atomic shared-directory writes."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.objectstore import (
    InvalidObjectKey,
    LocalDirectoryStore,
    MemoryStore,
    ObjectMissing,
    ObjectStore,
    available_object_stores,
    key_of,
    load_object_store,
)


@pytest.fixture(params=["local", "memory"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalDirectoryStore(tmp_path / "objects")
    return MemoryStore()


def test_put_is_content_addressed_and_idempotent(any_store: ObjectStore) -> None:
    data = b"hello state sync" * 1000
    key = any_store.put(data)
    assert key == hashlib.sha256(data).hexdigest() == key_of([data])
    assert any_store.put(memoryview(data)) == key
    assert any_store.has(key)
    assert any_store.get(key) == data
    assert list(any_store.keys()) == [key]
    with any_store.open(key) as stream:
        assert stream.read(5) == b"hello"


def test_streaming_forms_store_the_concatenation(any_store: ObjectStore, tmp_path: Path) -> None:
    parts = [b"a" * 10, bytearray(b"b" * 20_000_000), memoryview(b"c" * 7)]
    key = any_store.put_chunks(iter(parts))
    assert key == hashlib.sha256(b"".join(bytes(p) for p in parts)).hexdigest()
    source = tmp_path / "blob.bin"
    source.write_bytes(b"xyz" * 100_000)
    assert any_store.get(any_store.put_file(source)) == source.read_bytes()


def test_missing_and_invalid_keys_raise_clear_errors(any_store: ObjectStore) -> None:
    absent = hashlib.sha256(b"never stored").hexdigest()
    assert not any_store.has(absent)
    with pytest.raises(ObjectMissing) as missing:
        any_store.get(absent)
    assert absent in str(missing.value)
    assert str(any_store) in str(missing.value)
    assert missing.value.reason == "object-missing"
    for bad in ["../../etc/passwd", "ABC", absent.upper(), absent + "0"]:
        with pytest.raises(InvalidObjectKey):
            any_store.get(bad)
    any_store.delete(absent)  # idempotent
    key = any_store.put(b"x")
    any_store.delete(key)
    any_store.delete(key)
    assert not any_store.has(key)


def test_local_layout_is_sharded_read_only_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path)
    key = store.put(b"payload")
    path = store.path(key)
    assert path == tmp_path / "objects" / key[:2] / key
    assert path.read_bytes() == b"payload"
    assert not stat.S_IMODE(path.stat().st_mode) & 0o222
    assert list((tmp_path / "tmp").iterdir()) == []
    assert repr(store) == f"LocalDirectoryStore({str(tmp_path)!r})"


def test_a_writer_that_fails_midway_leaves_nothing(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path)

    def chunks() -> Iterator[bytes]:
        yield b"first part"
        raise RuntimeError("value went away")

    with pytest.raises(RuntimeError):
        store.put_chunks(chunks())
    assert list(store.keys()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sweep_removes_only_old_partials(tmp_path: Path) -> None:
    store = LocalDirectoryStore(tmp_path)
    old, fresh = tmp_path / "tmp" / "1-old.partial", tmp_path / "tmp" / "2-new.partial"
    old.write_bytes(b"x")
    fresh.write_bytes(b"y")
    an_hour_ago = time.time() - 7200
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert store.sweep_partials(max_age_s=3600) == 1
    assert not old.exists()
    assert fresh.exists()


def test_concurrent_writers_of_one_key_agree(tmp_path: Path) -> None:
    """Two stores on one directory (two hosts on a shared FS), eight threads, one object."""
    stores = [LocalDirectoryStore(tmp_path), LocalDirectoryStore(tmp_path, fsync=False)]
    data = os.urandom(3 * 1024 * 1024)
    barrier = threading.Barrier(8)
    keys: list[str] = []
    seen: list[bytes] = []

    def writer(i: int) -> None:
        barrier.wait()
        key = stores[i % 2].put_chunks([data[:1000], data[1000:]])
        keys.append(key)
        seen.append(stores[(i + 1) % 2].get(key))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(keys) == 8
    assert set(keys) == {hashlib.sha256(data).hexdigest()}
    assert all(blob == data for blob in seen)
    assert list(stores[0].keys()) == keys[:1]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_backends_are_selected_by_short_name(tmp_path: Path) -> None:
    assert {"local", "memory"} <= set(available_object_stores())
    local = load_object_store("local", root=tmp_path)
    assert isinstance(local, LocalDirectoryStore)
    assert local.root == tmp_path
    assert isinstance(load_object_store("memory"), MemoryStore)
    with pytest.raises(InvalidRequest, match=r"unknown object store 's4'.*local"):
        load_object_store("s4")
