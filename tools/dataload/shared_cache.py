"""MinIO across users: a cache the host agent's broker holds, opened with a share key.

`SharedCache(dataset, size, key)` is a `cache.CachedDataset` whose items live in a segment of
the host agent's cache broker (`kernelfleet.kernels.agent.cache_broker`), which every kernel of
the host may read once it proves it knows the key, and only the broker writes: this kernel maps
the segment read-only, reads hits straight from it (decoded with `tensor_format`, checked, never
unpickled), and sends each miss to the broker, which stores it once (fill once, never evict).
The broker's socket reaches a replica as ``KERNELFLEET_CACHE_BROKER``.

The segment's layout is the broker's: a 64-byte header (magic, items, capacity, used, stored),
16 bytes of index per item (offset into the data, length; 0 = absent), the data from the
``data_start`` the broker names.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import socket
import struct
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload import tensor_format
from kernelfleet.tools.dataload.cache import CachedDataset, dataset_identity
from kernelfleet.tools.dataload.coordinate_wire import Channel, ConnectionClosed, ProtocolError
from kernelfleet.tools.dataload.share import check_key
from kernelfleet.tools.dataload.sizes import format_size

BROKER_ENV = "KERNELFLEET_CACHE_BROKER"
HEADER = struct.Struct("<8sQQQQ")
MAGIC = b"KFCACHE1"
HEADER_BYTES = 64
ENTRY = struct.Struct("<QQ")
TIMEOUT_S = 30.0


def verifier(key: str, name: str) -> str:
    """What the broker keeps of the key for the cache ``name``: openers prove knowledge of it."""
    message = f"kernelfleet-cache\0{name}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def _proof(key: str, name: str, challenge: Any) -> str:
    if not isinstance(challenge, str):
        raise InvalidRequest(f"the cache broker sent a challenge of {type(challenge).__name__}")
    return hmac.new(verifier(key, name).encode(), challenge.encode(), hashlib.sha256).hexdigest()


def _broker_path(broker: str | None) -> str:
    path = broker or os.environ.get(BROKER_ENV, "")
    if not path:
        raise InvalidRequest(
            f"no cache broker: {BROKER_ENV} is not set (kernels of a kernelfleet host agent "
            "have it); --share needs the host agent's broker"
        )
    return path


def _connect(path: str) -> Channel:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as error:
        sock.close()
        raise InvalidRequest(f"cannot reach the cache broker at {path}: {error}") from None
    return Channel(sock, shared=True)


def drop_shared_cache(name: str, key: str, broker: str | None = None) -> bool:
    """Has the broker let the shared cache ``name`` go; False when there was none. Raises
    `InvalidRequest` for a key that is not the cache's (`ValueError` for a malformed one)."""
    check_key(key)
    channel = _connect(_broker_path(broker))
    try:
        challenge = channel.receive(TIMEOUT_S)
        channel.send(("drop", name, _proof(key, name, challenge[1])), TIMEOUT_S)
        answer = channel.receive(TIMEOUT_S)
    except (ConnectionClosed, ProtocolError, TimeoutError, OSError, IndexError) as error:
        raise InvalidRequest(f"the cache broker failed: {error}") from None
    finally:
        channel.close()
    if answer[0] == "error":
        raise InvalidRequest(str(answer[1]))
    return answer[0] == "dropped"


class SharedCache(CachedDataset):
    """MinIO over ``dataset`` in the broker's cache ``name`` (the dataset's identity if None),
    made with ``size_bytes`` if it does not exist yet. Raises `InvalidRequest` when there is no
    broker, when the key is not the cache's, or when the broker refuses the size."""

    def __init__(
        self,
        dataset: Any,
        size_bytes: int,
        key: str,
        name: str | None = None,
        broker: str | None = None,
    ) -> None:
        super().__init__(dataset)
        self.name = name or dataset_identity(dataset)
        self.size_bytes = size_bytes
        self._key = check_key(key)
        self._broker_gone = False
        self.broker = _broker_path(broker)
        self._open()

    # -- the broker --------------------------------------------------------------------------

    def _open(self) -> None:
        channel = _connect(self.broker)
        try:
            answer = self._handshake(channel)
            if answer[0] == "error":
                raise InvalidRequest(str(answer[1]))
            if answer[0] != "opened" or len(channel.fds) != 1:
                raise InvalidRequest(f"the cache broker answered {answer!r:.100}")
            fd = channel.fds.pop()
        except (ConnectionClosed, ProtocolError, TimeoutError, OSError) as error:
            channel.close()
            raise InvalidRequest(f"the cache broker at {self.broker} failed: {error}") from None
        except InvalidRequest:
            channel.close()
            raise
        layout = answer[1]
        try:
            self._map = mmap.mmap(fd, layout["size"], mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        self._data_start = layout["data_start"]
        self._size = layout["size"]
        self._channel = channel
        self._pid = os.getpid()
        if layout["items"] != len(self.dataset):
            self.close()
            raise InvalidRequest(
                f"the shared cache {self.name!r} holds {layout['items']} items, "
                f"not {len(self.dataset)}: a cache of another dataset"
            )

    def _handshake(self, channel: Channel) -> tuple[Any, ...]:
        challenge = channel.receive(TIMEOUT_S)
        if challenge[0] != "challenge" or not isinstance(challenge[1], str):
            raise InvalidRequest(f"the cache broker at {self.broker} sent {challenge!r:.100}")
        channel.send(("open", self.name, _proof(self._key, self.name, challenge[1])), TIMEOUT_S)
        answer = channel.receive(TIMEOUT_S)
        if answer[0] == "absent":
            mine = verifier(self._key, self.name)
            channel.send(("create", self.name, len(self.dataset), self.size_bytes, mine),
                         TIMEOUT_S)  # fmt: skip
            answer = channel.receive(TIMEOUT_S)
        return answer

    def _reconnect_after_fork(self) -> None:
        """A forked loader worker shares the parent's socket: it opens one of its own."""
        if os.getpid() != self._pid:
            self._map.close()
            self._open()

    # -- CachedDataset -----------------------------------------------------------------------

    def _encode(self, item: Any) -> bytes:
        return bytes(tensor_format.encode(item, "item"))

    def _decode(self, blob: bytes) -> Any:
        return tensor_format.decode(blob)

    @property
    def cached_items(self) -> int:
        return int(HEADER.unpack_from(self._map, 0)[4])

    def _lookup(self, index: int) -> bytes | None:
        offset, length = ENTRY.unpack_from(self._map, HEADER_BYTES + ENTRY.size * index)
        if not length:
            return None
        start = self._data_start + offset
        if start + length > self._size:
            raise tensor_format.TensorFormatError(f"item {index} lies beyond the segment")
        return self._map[start : start + length]

    def _admit(self, index: int, blob: bytes) -> None:
        """Offers the broker a missed item. The broker declines what is cached already, does
        not fit, or comes after a drop; if it is gone (the agent stopped), the cache stops
        filling and still serves what it holds."""
        if self._broker_gone:
            return
        self._reconnect_after_fork()
        try:
            self._channel.send(("put", index, len(blob)), TIMEOUT_S)
            self._channel.sock.sendall(blob)
            answer = self._channel.receive(TIMEOUT_S)
        except (ConnectionClosed, ProtocolError, TimeoutError, OSError):
            self._broker_gone = True
            return
        if answer[0] == "error":
            raise InvalidRequest(str(answer[1]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_map", "_channel"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._open()

    def close(self) -> None:
        """Unmaps the segment and leaves the broker (the cache stays for the others)."""
        self._channel.close()
        self._map.close()

    def __repr__(self) -> str:
        _, items, capacity, used, stored = HEADER.unpack_from(self._map, 0)
        return (f"shared MinIO cache {self.name!r} (the host's cache broker): {stored} of {items} "
                f"items, {format_size(used)} of {format_size(capacity)} used")  # fmt: skip
