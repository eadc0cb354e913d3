"""The host's broker of shared MinIO caches: memory the kernels of every user read, only it writes.

A `%dataload cache ... --share` cache is shared by kernels of different users (each kernel runs
as a user of its own under a root agent), so no kernel may write memory another one reads
unchecked, and none may own it. The host agent runs this broker; it outlives any kernel.

- **Segments.** Each cache is one memfd (``memfd_create``), sized once and sealed against
  shrinking and growing; the broker maps it writable and then seals it with
  ``F_SEAL_FUTURE_WRITE``, so every descriptor it hands out maps read-only (no ``write(2)``, no
  new writable mapping, whoever holds it), and ``F_SEAL_SEAL`` so nobody adds seals. Layout:
  a 64-byte header (`MAGIC`, items, data capacity, bytes used, items stored; little-endian
  u64s), an index of 16 bytes per item (offset into the data, length; 0 = absent), the data.
- **Who may open one.** A cache is named on the host. Its creator sends the broker a
  *verifier*, HMAC-SHA256 of the cache's name under the share key (the key itself never
  leaves the kernel); a later opener proves it knows the key with an HMAC of the broker's
  random challenge under that verifier. A wrong key is refused by name.
- **Filling.** A kernel that missed an item sends ``["put", index, nbytes]`` and the bytes
  (the item in `tensor_format`, which readers decode and check without unpickling). The broker
  allocates the bytes (fill once, never evict: an item already there, or one that does not
  fit, is declined), writes them, and publishes the index entry last; one writer can never
  touch another's bytes.
- **Size.** A cache larger than the free shared memory (``/dev/shm``'s free bytes less what
  the broker's caches already hold) is refused with both sizes.

Wire: the socket is ``<agent state dir>/cache-broker.sock`` (mode 0666 in the agent's folder,
which kernels can traverse but not write: no kernel can put another socket in its place); its
path reaches a replica as ``KERNELFLEET_CACHE_BROKER``. Frames are a 4-byte big-endian length
and a JSON array (at most `MAX_FRAME` bytes). Broker first: ``["challenge", nonce]``. Then the
client: ``["open", name, proof]`` (answered ``["absent"]``, ``["error", text]`` or
``["opened", layout]`` with the descriptor), ``["create", name, items, size, verifier]``
(answered the same way), ``["drop", name, proof]`` (answered ``["dropped"]``, ``["absent"]`` or
``["error", text]``: the broker lets the segment go; kernels that mapped it keep their mapping
until they close it), and once open ``["put", index, nbytes]`` + bytes (answered ``["stored"]``,
``["declined", why]`` or ``["error", text]``). Caches live until they are dropped or the agent
stops.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import mmap
import os
import secrets
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelfleet.kernels.agent.cache_broker")

MAGIC = b"KFCACHE1"
HEADER = struct.Struct("<8sQQQQ")
HEADER_BYTES = 64
ENTRY = struct.Struct("<QQ")
ALIGNMENT = 64
MAX_FRAME = 1 << 20
MAX_NAME = 128
MAX_ITEMS = 1 << 31
MAX_CONNECTIONS = 512
"""Connections served at once (a thread each); more are closed at once."""
FRAME_LENGTH = struct.Struct(">I")
SHM_DIR = Path("/dev/shm")
SOCKET_NAME = "cache-broker.sock"

# Linux's seals (fcntl names F_SEAL_FUTURE_WRITE only from Python 3.13 on some builds).
F_SEAL_SEAL = 0x0001
F_SEAL_SHRINK = 0x0002
F_SEAL_GROW = 0x0004
F_SEAL_FUTURE_WRITE = 0x0010


def data_start(items: int) -> int:
    """Where a cache of ``items`` items keeps its data: after the header and the index."""
    return -(-(HEADER_BYTES + ENTRY.size * items) // ALIGNMENT) * ALIGNMENT


def free_shared_memory() -> int:
    stats = os.statvfs(SHM_DIR)
    return stats.f_bavail * stats.f_frsize


def show_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB ({n} bytes)" if n >= 10**8 else f"{n / 1e6:.2f} MB ({n} bytes)"


class Refused(Exception):
    """A request the broker answers with an error; the text says why."""


@dataclass(eq=False)
class Cache:
    """One shared cache: its segment, writable mapping, and allocation state."""

    name: str
    items: int
    size: int
    verifier: str
    fd: int
    view: mmap.mmap
    used: int = 0
    stored: int = 0
    dropped: bool = False
    """Let go by a key holder: no more puts; the mapping goes when the last connection does."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def capacity(self) -> int:
        return self.size - data_start(self.items)

    def layout(self) -> dict[str, int]:
        return {"items": self.items, "size": self.size, "data_start": data_start(self.items)}

    def reserve(self, index: int, nbytes: int) -> int | str:
        """The offset (into the data) for item ``index``'s ``nbytes``, or why not."""
        with self.lock:
            if self.dropped:
                return "the cache was dropped"
            if self._entry(index)[1] or index in self._pending:
                return "already cached"
            if self.used + nbytes > self.capacity:
                return "the cache is full"
            offset = self.used
            self.used += -(-nbytes // ALIGNMENT) * ALIGNMENT
            self._pending.add(index)
            return offset

    def publish(self, index: int, offset: int, nbytes: int) -> None:
        """Makes item ``index`` visible: its entry's offset first, its length last."""
        with self.lock:
            at = HEADER_BYTES + ENTRY.size * index
            struct.pack_into("<Q", self.view, at, offset)
            struct.pack_into("<Q", self.view, at + 8, nbytes)
            self._pending.discard(index)
            self.stored += 1
            HEADER.pack_into(self.view, 0, MAGIC, self.items, self.capacity, self.used, self.stored)

    def abandon(self, index: int) -> None:
        """A put that did not complete: the item may be put again (its bytes stay unused)."""
        with self.lock:
            self._pending.discard(index)

    def _entry(self, index: int) -> tuple[int, int]:
        offset, length = ENTRY.unpack_from(self.view, HEADER_BYTES + ENTRY.size * index)
        return offset, length

    def __post_init__(self) -> None:
        self._pending: set[int] = set()


def make_segment(name: str, items: int, size: int) -> tuple[int, mmap.mmap]:
    """A sealed memfd of ``size`` bytes with an empty header and index, and its writable map."""
    fd = os.memfd_create(f"kernelfleet-cache-{name}", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
        view = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        HEADER.pack_into(view, 0, MAGIC, items, size - data_start(items), 0, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd, view


class CacheBroker:
    """Serves the host's shared caches on a unix socket, one thread per connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.caches: dict[str, Cache] = {}
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    # -- life --------------------------------------------------------------------------------

    def start(self) -> None:
        """Listens (replacing a stale socket file) and serves in a daemon thread."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # any kernel may connect: the share key is the capability
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, name="cache-broker", daemon=True).start()

    def stop(self) -> None:
        """Stops listening and releases every cache (kernels keep what they mapped)."""
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with self.lock:
            for cache in self.caches.values():
                with contextlib.suppress(BufferError):  # a put in flight keeps it until it ends
                    cache.view.close()
                os.close(cache.fd)
            self.caches.clear()

    def _accept(self) -> None:
        while self.listener is not None:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                log.warning("cache broker: %d connections open, refusing another", MAX_CONNECTIONS)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    # -- one connection ----------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        try:
            with sock:
                Connection(self, sock).run()
        except (OSError, EOFError, ValueError) as error:
            log.debug("cache broker: a connection ended: %s", error)
        finally:
            self.slots.release()

    def open(self, name: str, challenge: str, proof: Any) -> Cache | None:
        with self.lock:
            cache = self.caches.get(name)
        if cache is None:
            return None
        expected = hmac.new(cache.verifier.encode(), challenge.encode(), hashlib.sha256)
        if not (isinstance(proof, str) and hmac.compare_digest(proof, expected.hexdigest())):
            raise Refused(f"the shared cache {name!r} refused this share key: it is not the key "
                          "the cache was made with")  # fmt: skip
        return cache

    def drop(self, name: str, challenge: str, proof: Any) -> bool:
        if self.open(name, challenge, proof) is None:
            return False
        with self.lock:
            cache = self.caches.pop(name, None)
        if cache is not None:
            with cache.lock:
                cache.dropped = True
                os.close(cache.fd)  # the mapping stays while a connection may write into it
            log.info("shared cache %r dropped", name)
        return True

    def create(self, name: str, items: int, size: int, verifier: str) -> Cache:
        with self.lock:
            cache = self.caches.get(name)
            if cache is not None:
                if not hmac.compare_digest(cache.verifier, verifier):
                    raise Refused(f"the shared cache {name!r} refused this share key: it is not "
                                  "the key the cache was made with")  # fmt: skip
                return cache
            if size < data_start(items):
                raise Refused(f"a cache of {size} bytes cannot hold the index of {items} items "
                              f"({data_start(items)} bytes)")  # fmt: skip
            held = sum(c.size for c in self.caches.values())
            free = max(0, free_shared_memory() - held)
            if size > free:
                raise Refused(f"a cache of {show_size(size)} is larger than the free shared "
                              f"memory: {show_size(free)} (free in {SHM_DIR}, less "
                              f"{show_size(held)} held by this host's shared caches)")  # fmt: skip
            fd, view = make_segment(name, items, size)
            cache = Cache(name, items, size, verifier, fd, view)
            self.caches[name] = cache
            log.info("shared cache %r: %d items, %d bytes", name, items, size)
            return cache


class Connection:
    """One client: the challenge, an open or create, then puts."""

    def __init__(self, broker: CacheBroker, sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self.cache: Cache | None = None

    def send(self, message: list[Any], fds: list[int] | None = None) -> None:
        body = json.dumps(message).encode()
        frame = FRAME_LENGTH.pack(len(body)) + body
        if fds:
            sent = socket.send_fds(self.sock, [frame], fds)
            self.sock.sendall(frame[sent:])
        else:
            self.sock.sendall(frame)

    def receive_exactly(self, n: int, into: memoryview | None = None) -> bytes:
        target = memoryview(bytearray(n)) if into is None else into
        got = 0
        while got < n:
            count = self.sock.recv_into(target[got:], n - got)
            if count == 0:
                raise EOFError("the client went away")
            got += count
        return bytes(target) if into is None else b""

    def receive(self) -> list[Any]:
        (length,) = FRAME_LENGTH.unpack(self.receive_exactly(FRAME_LENGTH.size))
        if length > MAX_FRAME:
            raise ValueError(f"a frame of {length} bytes")
        message = json.loads(self.receive_exactly(length))
        if not (isinstance(message, list) and message and isinstance(message[0], str)):
            raise ValueError("a frame that is not a message")
        return message

    def run(self) -> None:
        challenge = secrets.token_hex(32)
        self.send(["challenge", challenge])
        while True:
            message = self.receive()
            try:
                self.handle(message, challenge)
            except Refused as refused:
                self.send(["error", str(refused)])

    def handle(self, message: list[Any], challenge: str) -> None:
        kind, args = message[0], message[1:]
        if kind == "open" and len(args) == 2 and _is_name(args[0]):
            cache = self.broker.open(args[0], challenge, args[1])
            if cache is None:
                self.send(["absent"])
            else:
                self._opened(cache)
        elif kind == "create" and len(args) == 4 and _is_name(args[0]):
            name, items, size, verifier = args
            if not (_is_int(items) and 0 < items <= MAX_ITEMS and _is_int(size) and size > 0):
                raise Refused(f"items {items!r} and size {size!r} must be positive ints")
            if not (isinstance(verifier, str) and len(verifier) == 64):
                raise Refused("a verifier is 64 hex digits")
            self._opened(self.broker.create(name, items, size, verifier))
        elif kind == "drop" and len(args) == 2 and _is_name(args[0]):
            dropped = self.broker.drop(args[0], challenge, args[1])
            self.send(["dropped"] if dropped else ["absent"])
        elif kind == "put" and self.cache is not None and len(args) == 2:
            self.put(self.cache, *args)
        else:
            raise Refused(f"not a request here: {json.dumps(message)[:100]}")

    def _opened(self, cache: Cache) -> None:
        self.cache = cache
        self.send(["opened", cache.layout()], [cache.fd])

    def put(self, cache: Cache, index: Any, nbytes: Any) -> None:
        if not (_is_int(index) and 0 <= index < cache.items and _is_int(nbytes) and nbytes > 0):
            raise ValueError(f"a put of item {index!r}, {nbytes!r} bytes")  # ends the connection
        if nbytes > cache.capacity:
            _drain(self, nbytes)  # read and drop: the stream stays in step
            self.send(["declined", "larger than the cache"])
            return
        reserved = cache.reserve(index, nbytes)
        if isinstance(reserved, str):
            _drain(self, nbytes)
            self.send(["declined", reserved])
            return
        start = data_start(cache.items) + reserved
        try:
            with memoryview(cache.view) as whole:
                self.receive_exactly(nbytes, whole[start : start + nbytes])
        except BaseException:
            cache.abandon(index)
            raise
        cache.publish(index, reserved, nbytes)
        self.send(["stored"])


def _drain(connection: Connection, nbytes: int) -> None:
    while nbytes:
        chunk = min(nbytes, 1 << 20)
        connection.receive_exactly(chunk)
        nbytes -= chunk


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_name(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NAME
        and all(c.isalnum() or c in "_.-" for c in value)
        and value.isascii()
    )
