"""A fill-once item store in a named POSIX shared-memory segment: MinIO's storage.

The segment (``/dev/shm/<name>``) holds, in order::

    header   64 bytes: magic, item count N, data capacity, bytes used, items stored
    index    N slots of 16 bytes: (offset, length) of item i in the data area; length 0 = absent
    data     the items' bytes, one after another, never moved and never evicted

Any process on the host opens the same store by name (`SharedItemStore.open`): the first
creates the segment, the others attach to it. A lock file beside it (``/dev/shm/<name>.lock``,
``flock``) serialises writers (`put` holds it exclusively) against readers (`get` holds it
shared), so concurrent fillers are safe; the lock is re-opened in a forked child (a
``DataLoader`` worker), since ``flock`` locks belong to an open file and a child shares its
parent's. Creation also happens under the lock, so an attacher never sees a half-written header.

Who may open it: the user who made it (the segment and the lock file are mode 0600), so a
store is shared by the processes of one user: a kernel's replicas and loader workers, and the
kernels and jobs of a host whose agent runs them all as its own user. Where each kernel runs as
a user of its own (docs/security.md), kernels do not share stores: items are unpickled when
read, and a store another user could write would let that user's notebook run code in this one.
Opening another user's store raises `InvalidRequest`, saying so.

Lifetime: a store outlives every process that opened it (no resource tracker unlinks it at
exit); `drop` (``%dataload cache --drop NAME``) removes the segment and its lock file. The
process that decides the data is no longer needed calls it; tests drop what they create.
"""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.sizes import format_size

SHM_DIR = Path("/dev/shm")
MAGIC = b"KFMINIO1"
_HEADER = struct.Struct("<8sQQQQ")  # magic, items, data capacity, used, stored
HEADER_BYTES = 64
_SLOT = struct.Struct("<QQ")  # offset, length


class CacheTooLarge(InvalidRequest):
    """The asked size exceeds the free shared memory of the host."""

    reason = "cache-too-large"


def free_shared_memory(directory: Path = SHM_DIR) -> int:
    """Bytes free to an unprivileged writer in the shared-memory file system."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def overhead_bytes(items: int) -> int:
    """Bytes of a store of `items` items that are header and index, not data."""
    return HEADER_BYTES + _SLOT.size * items


@dataclass(frozen=True)
class StoreState:
    """A store's header as read at one moment."""

    items: int
    capacity_bytes: int
    used_bytes: int
    stored: int


class SharedItemStore:
    """Items of a dataset by index, as bytes, in a named shared-memory segment (see the module
    docstring). Not thread-safe within one process; safe across processes."""

    def __init__(self, segment: SharedMemory, name: str) -> None:
        self.name = name
        self._segment = segment
        self._lock_fd = -1
        self._lock_pid = -1

    @classmethod
    def open(cls, name: str, size: int, items: int) -> SharedItemStore:
        """The store `name`: attached when it exists (its item count must be `items`; its size
        stays what it was), else created with `size` bytes in all for `items` items. Raises
        `CacheTooLarge` when `size` exceeds the free shared memory, `InvalidRequest` when
        `size` cannot hold the index, or when an existing store was made for another count."""
        if size <= overhead_bytes(items):
            raise InvalidRequest(
                f"a cache of {format_size(size)} cannot even hold the index of {items} items "
                f"({format_size(overhead_bytes(items))})"
            )
        if not _segment_path(name).exists():
            _refuse_beyond_free_memory(size)  # before the lock file is made, to leave nothing
        with _Lock(name, exclusive=True):
            if _segment_path(name).exists():
                store = cls._attach_unlocked(name)
                if store.state().items != items:
                    found = store.state().items
                    store.close()
                    raise InvalidRequest(
                        f"the cache {name!r} holds a dataset of {found} items, not {items}: "
                        "give another name, or drop it first"
                    )
                return store
            _refuse_beyond_free_memory(size)
            segment = SharedMemory(name=name, create=True, size=size)
            _untrack(segment)
            store = cls(segment, name)
            capacity = size - overhead_bytes(items)
            _HEADER.pack_into(store._buf, 0, MAGIC, items, capacity, 0, 0)
            return store

    @classmethod
    def attach(cls, name: str) -> SharedItemStore:
        """The existing store `name`; raises `InvalidRequest` when there is none."""
        if not _segment_path(name).exists():
            raise InvalidRequest(f"there is no cache named {name!r} on this host")
        with _Lock(name, exclusive=False):
            return cls._attach_unlocked(name)

    @classmethod
    def _attach_unlocked(cls, name: str) -> SharedItemStore:
        try:
            segment = SharedMemory(name=name)
        except FileNotFoundError:
            raise InvalidRequest(f"there is no cache named {name!r} on this host") from None
        except PermissionError:
            raise _another_users(name) from None
        _untrack(segment)
        store = cls(segment, name)
        if segment.size < HEADER_BYTES or bytes(store._buf[: len(MAGIC)]) != MAGIC:
            segment.close()
            raise InvalidRequest(f"the shared-memory segment {name!r} is not a kernelfleet cache")
        return store

    @property
    def _buf(self) -> memoryview:
        buf = self._segment.buf
        if buf is None:
            raise ValueError(f"the cache {self.name!r} is closed in this process")
        return buf

    def state(self) -> StoreState:
        _, items, capacity, used, stored = _HEADER.unpack_from(self._buf, 0)
        return StoreState(items, capacity, used, stored)

    def get(self, index: int) -> bytes | None:
        """Item `index`'s bytes, or None when it is not stored."""
        with self._locked(exclusive=False):
            offset, length = _SLOT.unpack_from(self._buf, self._slot(index))
            if length == 0:
                return None
            start = self._data_start() + offset
            return bytes(self._buf[start : start + length])

    def put(self, index: int, blob: bytes) -> bool:
        """Store `blob` as item `index` unless the item is stored already or does not fit in
        what is left (nothing is ever evicted). True when the item is stored on return."""
        if not blob:
            raise ValueError("an item of no bytes cannot be stored")
        with self._locked(exclusive=True):
            buf = self._buf
            slot = self._slot(index)
            if _SLOT.unpack_from(buf, slot)[1]:
                return True
            magic, items, capacity, used, stored = _HEADER.unpack_from(buf, 0)
            if used + len(blob) > capacity:
                return False
            start = self._data_start() + used
            buf[start : start + len(blob)] = blob
            _SLOT.pack_into(buf, slot, used, len(blob))
            _HEADER.pack_into(buf, 0, magic, items, capacity, used + len(blob), stored + 1)
            return True

    def close(self) -> None:
        """Detach this process (the store stays; see `drop`)."""
        if self._lock_fd >= 0 and self._lock_pid == os.getpid():
            os.close(self._lock_fd)
        self._lock_fd = -1
        self._segment.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(SharedItemStore.attach(state["name"]).__dict__)

    def _slot(self, index: int) -> int:
        items = self.state().items
        if not 0 <= index < items:
            raise IndexError(f"item {index} of a cache of {items} items")
        return HEADER_BYTES + _SLOT.size * index

    def _data_start(self) -> int:
        return overhead_bytes(self.state().items)

    def _locked(self, *, exclusive: bool) -> _HeldLock:
        if self._lock_pid != os.getpid():  # first use here, or a forked child
            self._lock_fd = _open_lock_file(self.name)
            self._lock_pid = os.getpid()
        return _HeldLock(self._lock_fd, exclusive)


def drop(name: str) -> bool:
    """Remove the store `name` from the host (processes still attached keep their mapping
    until they close it). False when there was none."""
    with _Lock(name, exclusive=True):
        try:
            segment = SharedMemory(name=name)
        except FileNotFoundError:
            found = False
        else:
            segment.close()
            segment.unlink()  # also forgets it in the resource tracker, which just noted it
            found = True
    _lock_path(name).unlink(missing_ok=True)
    return found


def _refuse_beyond_free_memory(size: int) -> None:
    free = free_shared_memory()
    if size > free:
        raise CacheTooLarge(
            f"a cache of {format_size(size)} is larger than the free shared memory "
            f"in {SHM_DIR}: {format_size(free)}"
        )


def _segment_path(name: str) -> Path:
    return SHM_DIR / name


def _lock_path(name: str) -> Path:
    return SHM_DIR / f"{name}.lock"


def _open_lock_file(name: str) -> int:
    try:
        return os.open(_lock_path(name), os.O_RDWR | os.O_CREAT, 0o600)
    except PermissionError:
        raise _another_users(name) from None


def _another_users(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"the cache {name!r} belongs to another user of this host: a cache is shared by the "
        "processes of one user only (docs/dataload.md), give another name"
    )


def _untrack(segment: SharedMemory) -> None:
    """Keep Python's resource tracker from unlinking the segment when this process exits
    (Python 3.11 registers every opened segment): the store outlives its users."""
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]


class _HeldLock:
    """``flock`` on an open lock file for the span of a ``with`` block."""

    def __init__(self, fd: int, exclusive: bool) -> None:
        self._fd = fd
        self._mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self) -> None:
        fcntl.flock(self._fd, self._mode)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


class _Lock:
    """The store's lock, held through a lock file opened (and closed) for one block."""

    def __init__(self, name: str, *, exclusive: bool) -> None:
        self._name = name
        self._exclusive = exclusive
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = _open_lock_file(self._name)
        _HeldLock(self._fd, self._exclusive).__enter__()

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing releases the lock
