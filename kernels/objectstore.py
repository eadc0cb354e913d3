"""Content-addressed object store for values too large for the Raft log.

State sync puts a large value here and writes only its key (a sha256 hex digest of the stored
bytes) into the kernel's Raft log; followers fetch it by key. Objects are immutable: the same
bytes always get the same key, so ``put`` is idempotent and concurrent writers of one key are
harmless.

Contract for every backend:

- The API is synchronous. It is called from a worker thread (never the asyncio loop, never
  pysyncobj's tick thread), and every method must be safe to call from several threads and
  several processes (replicas on other hosts) at once.
- ``put*`` returns only once the object is durable and visible to every host that shares the
  store; a reader never sees a partially written object.
- ``get``/``open`` of a key that is not there raise `ObjectMissing` naming the key and the
  store; keys that are not 64 lowercase hex digits raise `InvalidObjectKey` (keys come from the
  log, so a bad one must not become a path).
- ``delete`` is idempotent. Deciding what is garbage is the caller's job (the log owner knows
  which keys its snapshot still references). ``put*`` of an object already there, and
  ``keep``, refresh its time, so a collector that waits a grace period after an object was
  last written or reused does not delete one a new log entry is about to point to.

Garbage collection (who deletes what; docs/architecture.md has the whole picture):

- Superseded objects of a live kernel (a variable bound again, or deleted): the replica that
  leads the kernel's Raft group, as the kernel's own user, once no live log entry points to
  them, every replica's log has the newer entry, and a grace period passed
  (`kernelfleet.kernels.replica.statesync_gc`).
- Every object of a kernel that is shut down: the gateway removes the kernel's folder at once,
  and, every little while, the folders of kernels it does not know (neither running nor in its
  state file) whose last change is older than the grace period
  (`kernelfleet.gateway.objects_gc`). A restarted gateway knows its adopted kernels from its
  state file, so their objects stay. The gateway needs the right to remove the folders: it
  runs as root, or as the user the kernels run as.

Kernels of different users share one `LocalDirectoryStore` root: `prepare_shared_root` makes it
mode 1733 (any user may create a folder there, nobody may list it or remove another's folder),
and `LocalDirectoryStore.for_kernel` keeps each kernel's objects in a folder of its own, mode
0700, which its replicas (one user per kernel, on every host) create on first use.

Backends are plug-ins: entry-point group ``kernelfleet.object_stores``, selected by short name
with `load_object_store`. Built in: ``local`` (`LocalDirectoryStore`, a directory every host
can reach) and ``memory`` (`MemoryStore`, one process only: tests and single-host use).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import stat
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, BinaryIO

from kernelfleet.errors import FleetError, InvalidRequest

log = logging.getLogger("kernelfleet.statesync.objectstore")

DEFAULT_GRACE = 60.0
"""Seconds an object no live value points to is kept before it is deleted (by both collectors:
`kernels.replica.statesync_gc` and `gateway.objects_gc`)."""
GRACE_ENV = "KERNELFLEET_OBJECTS_GRACE"


def grace_from_env(default: float = DEFAULT_GRACE) -> float:
    """`GRACE_ENV` as seconds >= 0, else `default`."""
    try:
        value = float(os.environ.get(GRACE_ENV, ""))
    except ValueError:
        return default
    return value if value >= 0 else default


ENTRY_POINT_GROUP = "kernelfleet.object_stores"
HASH_NAME = "sha256"
CHUNK_BYTES = 8 * 1024 * 1024  # hashing/writing granularity: bounded, cache-friendly
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHARED_ROOT_MODE = 0o1733

Chunk = bytes | bytearray | memoryview


class ObjectStoreError(FleetError):
    """Base class of object-store failures."""

    reason = "object-store-error"


class ObjectMissing(ObjectStoreError):
    """The key is not in the store (never written, deleted, or the store is not shared)."""

    reason = "object-missing"

    def __init__(self, key: str, store: ObjectStore | str) -> None:
        self.key = key
        self.store = str(store)
        super().__init__(f"object {key} is not in {self.store}")


class ObjectCorrupt(ObjectStoreError):
    """The stored bytes do not match their key, or are not in the expected format."""

    reason = "object-corrupt"


class InvalidObjectKey(ObjectStoreError):
    """A key that is not a sha256 hex digest."""

    reason = "invalid-object-key"


def check_key(key: str) -> str:
    """Return `key` if it is 64 lowercase hex digits, else raise `InvalidObjectKey`."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise InvalidObjectKey(f"not an object key (64 lowercase hex digits): {key!r:.80}")
    return key


def _byte_view(chunk: Chunk) -> memoryview:
    view = chunk if isinstance(chunk, memoryview) else memoryview(chunk)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _slices(chunks: Iterable[Chunk]) -> Iterator[memoryview]:
    """The chunks as flat byte views of at most `CHUNK_BYTES` each (no copies)."""
    for chunk in chunks:
        view = _byte_view(chunk)
        for start in range(0, len(view), CHUNK_BYTES):
            yield view[start : start + CHUNK_BYTES]


def key_of(chunks: Iterable[Chunk]) -> str:
    """The key the store would give the concatenation of `chunks` (hashes, copies nothing)."""
    digest = hashlib.new(HASH_NAME)
    for piece in _slices(chunks):
        digest.update(piece)
    return digest.hexdigest()


class ObjectStore(ABC):
    """A content-addressed blob store shared by a kernel's replicas. See the module docstring."""

    name: str = "abstract"

    @abstractmethod
    def put_chunks(self, chunks: Iterable[Chunk]) -> str:
        """Store the concatenation of `chunks`; return its key.

        The streaming form: chunks are consumed one at a time and never joined in memory, so a
        1 GB value costs no extra 1 GB here. Idempotent.
        """

    def put(self, data: Chunk) -> str:
        """Store `data`; return its key (sha256 hex). Idempotent."""
        key = key_of([data])
        if not self.keep(key):
            self.put_chunks([data])
        return key

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Store the contents of the file at `path`, streamed; return its key."""
        with open(path, "rb", buffering=0) as source:
            return self.put_chunks(iter(lambda: source.read(CHUNK_BYTES), b""))

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable, seekable binary file of the object. The caller closes it."""

    def get(self, key: str) -> bytes:
        """The object's bytes (one copy in memory; use `open` for huge objects)."""
        with self.open(key) as stream:
            return stream.read()

    @abstractmethod
    def has(self, key: str) -> bool:
        """Whether the object is present (a snapshot: it may be deleted right after)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object if present. Idempotent."""

    def keep(self, key: str) -> bool:
        """Whether the object is present; if so, mark it freshly used, so that a collector's
        grace period starts again (the writer is about to point a log entry to it)."""
        return self.has(key)

    @abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key present, in no particular order (for garbage collection)."""

    def __str__(self) -> str:
        return repr(self)


class LocalDirectoryStore(ObjectStore):
    """Objects as files under `root`, a directory every replica's host can reach (shared FS).

    Layout: ``root/objects/<first 2 hex>/<key>``; writes go to ``root/tmp/*.partial`` on the
    same filesystem, are fsynced, then renamed into place (``os.replace`` is atomic), and the
    shard directory is fsynced. Two writers of one key each write their own temp file and the
    last rename wins with identical bytes, so readers only ever see complete objects.
    Objects are made read-only (0o444). `sweep_partials` removes temp files left by a writer
    that died mid-write. No in-memory state: safe across threads and processes.
    """

    name = "local"

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._objects = self.root / "objects"
        self._tmp = self.root / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalDirectoryStore({str(self.root)!r})"

    @classmethod
    def for_kernel(
        cls, root: str | os.PathLike[str], kernel_id: str, *, fsync: bool = True
    ) -> LocalDirectoryStore:
        """The store of kernel `kernel_id` under a shared `root`: ``root/kernel-<id>``, made
        0700 by the first replica that uses it.

        Raises `ObjectStoreError` when the folder cannot be created (the root does not let
        this user create one: see `prepare_shared_root`) or is not this user's own and private
        (another user made it first: its objects could not be trusted)."""
        base = Path(root)
        folder = base / kernel_folder_name(kernel_id)
        try:
            if not base.exists():
                base.mkdir(parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
            found = os.lstat(folder)
        except OSError as e:
            raise ObjectStoreError(
                f"cannot create {folder} ({e.strerror}): the object store's root must let every "
                f"kernel's user create its folder there (mode {SHARED_ROOT_MODE:o}; the gateway "
                "sets it on its --object-store-root)"
            ) from e
        uid = os.geteuid()
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != uid or found.st_mode & 0o077:
            raise ObjectStoreError(
                f"{folder} is not this kernel's own private folder (owner uid {found.st_uid}, "
                f"mode {stat.S_IMODE(found.st_mode):04o}; expected uid {uid}, mode 0700): "
                "refusing objects that another user could have written"
            )
        return cls(folder, fsync=fsync)

    def path(self, key: str) -> Path:
        """Where the object with `key` lives (whether or not it exists)."""
        check_key(key)
        return self._objects / key[:2] / key

    def put_chunks(self, chunks: Iterable[Chunk]) -> str:
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp, prefix=f"{os.getpid()}-", suffix=".partial")
        try:
            digest = hashlib.new(HASH_NAME)
            with open(fd, "wb", buffering=0, closefd=True) as out, _Hasher(digest) as hasher:
                for piece in _slices(chunks):
                    hashed = hasher.update(piece)  # hashing overlaps the write (both drop the GIL)
                    _write_all(out, piece)
                    hashed()
                if self.fsync:
                    os.fsync(out.fileno())
                os.fchmod(out.fileno(), 0o444)
            key = digest.hexdigest()
            final = self.path(key)
            if self.keep(key):
                os.unlink(tmp_name)
                return key
            final.parent.mkdir(exist_ok=True)
            os.replace(tmp_name, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        if self.fsync:
            _fsync_dir(final.parent)
        return key

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self.path(key), "rb", buffering=0)
        except FileNotFoundError:
            raise ObjectMissing(key, self) from None

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def keep(self, key: str) -> bool:
        try:
            os.utime(self.path(key))
        except FileNotFoundError:
            return False
        except PermissionError:  # another user's: present, but its time stays (not ours to GC)
            return self.has(key)
        return True

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def age(self, key: str) -> float | None:
        """Seconds since the object was last written or kept; None if it is not there."""
        try:
            return time.time() - self.path(key).stat().st_mtime
        except FileNotFoundError:
            return None

    def keys(self) -> Iterator[str]:
        for shard in sorted(self._objects.iterdir()):
            if shard.is_dir():
                yield from (p.name for p in shard.iterdir() if _KEY_RE.fullmatch(p.name))

    def sweep_partials(self, max_age_s: float = 3600.0) -> int:
        """Delete temp files older than `max_age_s` (writers that died); return how many."""
        cutoff = time.time() - max_age_s
        removed = 0
        for partial in self._tmp.glob("*.partial"):
            with contextlib.suppress(OSError):
                if partial.stat().st_mtime < cutoff:
                    partial.unlink()
                    removed += 1
        return removed


class MemoryStore(ObjectStore):
    """Objects in a dict of this process: for tests and a single-replica kernel. Thread-safe."""

    name = "memory"

    def __init__(self) -> None:
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._objects)} objects>)"

    def put_chunks(self, chunks: Iterable[Chunk]) -> str:
        data = b"".join(bytes(piece) for piece in _slices(chunks))
        key = hashlib.new(HASH_NAME, data).hexdigest()
        with self._lock:
            self._objects.setdefault(key, data)
        return key

    def open(self, key: str) -> BinaryIO:
        check_key(key)
        with self._lock:
            data = self._objects.get(key)
        if data is None:
            raise ObjectMissing(key, self)
        return io.BytesIO(data)

    def has(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._objects

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._objects.pop(key, None)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._objects))


_BUILTIN_STORES: dict[str, type[ObjectStore]] = {
    LocalDirectoryStore.name: LocalDirectoryStore,
    MemoryStore.name: MemoryStore,
}


def kernel_folder_name(kernel_id: str) -> str:
    """The name of kernel `kernel_id`'s folder under a shared root (see
    `LocalDirectoryStore.for_kernel`)."""
    name = kernel_id if _SAFE_NAME.fullmatch(kernel_id) else key_of([kernel_id.encode()])
    return f"kernel-{name}"


def prepare_shared_root(root: str | os.PathLike[str]) -> Path:
    """Create `root` for kernels of many users (mode 1733: each may create its kernel's folder
    there with `LocalDirectoryStore.for_kernel`; nobody may list the folders or remove another
    user's); returns it. Called by the gateway for its object store root."""
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(SHARED_ROOT_MODE)
    return path


def available_object_stores() -> list[str]:
    """Short names of the installed backends (entry points plus the built-in ones)."""
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(_BUILTIN_STORES)
    return sorted(names)


def load_object_store(name: str, **options: Any) -> ObjectStore:
    """Instantiate the backend registered as `name` with `options` (e.g. ``root=...``).

    Entry points of group ``kernelfleet.object_stores`` win over the built-ins of the same
    name. An unknown name raises `InvalidRequest` listing the known ones.
    """
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    store_class = matches[0].load() if matches else _BUILTIN_STORES.get(name)
    if store_class is None:
        raise InvalidRequest(
            f"unknown object store {name!r}; installed: {', '.join(available_object_stores())}"
        )
    store = store_class(**options)
    if not isinstance(store, ObjectStore):
        raise InvalidRequest(f"object store {name!r} is not an ObjectStore: {store!r}")
    return store


def _write_all(out: io.FileIO, piece: memoryview) -> None:
    written = 0
    while written < len(piece):
        count = out.write(piece[written:])
        if count is None:  # only for non-blocking files, which these are not
            raise OSError("short write to a blocking file")
        written += count


class _Hasher:
    """Feeds a hash from a helper thread (started on the first large piece), in order."""

    def __init__(self, digest: Any) -> None:
        self._digest = digest
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> _Hasher:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def update(self, piece: memoryview) -> Callable[[], Any]:
        if len(piece) < CHUNK_BYTES:
            self._digest.update(piece)
            return _nothing
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kernelfleet-objectstore-hash")
        return self._pool.submit(self._digest.update, piece).result


def _nothing() -> None:
    return None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some shared filesystems refuse fsync on directories
        log.debug("fsync of %s failed: %s", directory, exc)
    finally:
        os.close(fd)
