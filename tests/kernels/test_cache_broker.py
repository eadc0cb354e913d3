"""The host agent's cache broker, in-process, with a raw client over its socket: sealed
read-only segments, the key's verifier and proofs, fill-once puts, refusals with sizes."""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import mmap
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.kernels.agent import cache_broker
from kernelfleet.kernels.agent.cache_broker import (
    ENTRY,
    F_SEAL_FUTURE_WRITE,
    F_SEAL_GROW,
    F_SEAL_SEAL,
    F_SEAL_SHRINK,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    CacheBroker,
    data_start,
)
from kernelfleet.kernels.agent.jobs import JobRequest, JobTable
from kernelfleet.kernels.agent.kernel_process import KernelUser, choose_isolation
from kernelfleet.protocol import JobEnv

VERIFIER = "ab" * 32


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[CacheBroker]:
    broker = CacheBroker(tmp_path / "cache-broker.sock")
    broker.start()
    yield broker
    broker.stop()


class Client:
    """A raw client: frames, the challenge, descriptors."""

    def __init__(self, broker: CacheBroker) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(broker.path))
        self.fds: list[int] = []
        kind, self.challenge = self.receive()
        assert kind == "challenge"

    def send(self, *message: Any, raw: bytes = b"") -> None:
        body = json.dumps(list(message)).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body + raw)

    def receive(self) -> list[Any]:
        data, fds, _, _ = socket.recv_fds(self.sock, 4, 4)
        self.fds += fds
        if not data:
            raise EOFError("closed")
        while len(data) < 4:
            data += self.sock.recv(4 - len(data))
        (length,) = struct.unpack(">I", data)
        body = b""
        while len(body) < length:
            body += self.sock.recv(length - len(body))
        message: list[Any] = json.loads(body)
        return message

    def proof(self, verifier: str = VERIFIER) -> str:
        return hmac.new(verifier.encode(), self.challenge.encode(), hashlib.sha256).hexdigest()

    def create(self, name: str, items: int = 4, size: int = 4096) -> list[Any]:
        self.send("open", name, self.proof())
        answer = self.receive()
        if answer == ["absent"]:
            self.send("create", name, items, size, VERIFIER)
            answer = self.receive()
        return answer

    def close(self) -> None:
        self.sock.close()
        for fd in self.fds:
            os.close(fd)


def test_a_segment_is_sealed_so_its_holders_can_only_read(broker: CacheBroker) -> None:
    client = Client(broker)
    assert client.create("sealed") == ["opened", {"items": 4, "size": 4096, "data_start": 128}]
    (fd,) = client.fds
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals == F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE
    with pytest.raises(PermissionError):
        mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)
    rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # reopened for writing: still sealed
    with pytest.raises(PermissionError):
        os.pwrite(rw, b"x", 0)
    os.close(rw)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 8192)
    with pytest.raises(PermissionError):
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0x0008)  # F_SEAL_WRITE: no new seals either
    view = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
    assert HEADER.unpack_from(view, 0) == (MAGIC, 4, 4096 - 128, 0, 0)
    view.close()
    client.close()


def test_items_are_filled_once_and_read_by_every_opener(broker: CacheBroker) -> None:
    writer, reader = Client(broker), Client(broker)
    writer.create("filled")
    writer.send("put", 2, 5, raw=b"hello")
    assert writer.receive() == ["stored"]
    writer.send("put", 2, 3, raw=b"bye")  # the stream stays in step after a decline
    assert writer.receive() == ["declined", "already cached"]
    writer.send("put", 0, 3950, raw=bytes(3950))
    assert writer.receive() == ["declined", "the cache is full"]
    writer.send("put", 0, 4000, raw=bytes(4000))
    assert writer.receive() == ["declined", "larger than the cache"]
    reader.send("open", "filled", reader.proof())
    assert reader.receive()[0] == "opened"
    view = mmap.mmap(reader.fds[0], 4096, mmap.MAP_SHARED, mmap.PROT_READ)
    offset, length = ENTRY.unpack_from(view, HEADER_BYTES + ENTRY.size * 2)
    assert view[data_start(4) + offset : data_start(4) + offset + length] == b"hello"
    assert ENTRY.unpack_from(view, HEADER_BYTES) == (0, 0)  # item 0: absent
    assert HEADER.unpack_from(view, 0)[3:] == (64, 1)  # bytes used (aligned), items stored
    view.close()
    writer.close()
    reader.close()


def test_a_wrong_key_is_refused_by_name(broker: CacheBroker) -> None:
    owner, stranger = Client(broker), Client(broker)
    owner.create("mine")
    stranger.send("open", "mine", stranger.proof("cd" * 32))
    assert stranger.receive() == [
        "error",
        "the shared cache 'mine' refused this share key: it is not the key the cache was made with",
    ]
    stranger.send("create", "mine", 4, 4096, "cd" * 32)  # nor can it claim to make it
    assert "refused this share key" in stranger.receive()[1]
    assert stranger.fds == []
    stranger.send("put", 0, 1, raw=b"x")  # and it has nothing open to put into
    assert stranger.receive()[0] == "error"
    owner.close()
    stranger.close()


def test_a_cache_larger_than_free_shared_memory_is_refused_with_sizes(
    broker: CacheBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_broker, "free_shared_memory", lambda: 10_000)
    client = Client(broker)
    client.create("small", size=8192)
    other = Client(broker)
    answer = other.create("big", size=4096)
    assert answer == [
        "error",
        "a cache of 0.00 MB (4096 bytes) is larger than the free shared memory: 0.00 MB "
        "(1808 bytes) (free in /dev/shm, less 0.01 MB (8192 bytes) held by this host's shared "
        "caches)",
    ]
    assert other.create("tiny", items=1000, size=1000)[1].startswith(
        "a cache of 1000 bytes cannot hold the index of 1000 items"
    )
    client.close()
    other.close()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">I", 1 << 30),  # larger than any message
        struct.pack(">I", 3) + b"\xff\xfe\x00",  # not JSON
    ],
)
def test_a_malformed_frame_ends_the_connection_not_the_broker(
    broker: CacheBroker, frame: bytes
) -> None:
    bad = Client(broker)
    bad.sock.sendall(frame)
    with pytest.raises(EOFError):
        bad.receive()
    bad.close()
    good = Client(broker)
    assert good.create("still-serving")[0] == "opened"
    good.close()


def test_a_put_out_of_range_ends_the_connection(broker: CacheBroker) -> None:
    client = Client(broker)
    client.create("ranged")
    client.send("put", 4, 1, raw=b"x")
    with pytest.raises((EOFError, ConnectionResetError)):
        client.receive()
    client.close()


def test_jobs_are_told_the_brokers_socket(tmp_path: Path) -> None:
    """Kernels are (the live cache test reaches the broker from two kernels); jobs too."""
    table = JobTable(tmp_path, choose_isolation(KernelUser.SAME, tmp_path), base_env={})
    request = JobRequest("job-1", ("0",), {}, "print(1)", None, ())
    assert JobEnv.CACHE_BROKER.value not in table._job_env(request, {})
    table.cache_broker = tmp_path / "cache-broker.sock"
    env = table._job_env(request, {})
    assert env[JobEnv.CACHE_BROKER.value] == str(tmp_path / "cache-broker.sock")


def test_a_dropped_cache_declines_puts_and_stays_readable(broker: CacheBroker) -> None:
    holder, dropper = Client(broker), Client(broker)
    holder.create("let-go")
    holder.send("put", 0, 3, raw=b"one")
    assert holder.receive() == ["stored"]
    dropper.send("drop", "let-go", dropper.proof())
    assert dropper.receive() == ["dropped"]
    holder.send("put", 1, 3, raw=b"two")
    assert holder.receive() == ["declined", "the cache was dropped"]
    view = mmap.mmap(holder.fds[0], 4096, mmap.MAP_SHARED, mmap.PROT_READ)
    assert view[data_start(4) : data_start(4) + 3] == b"one"
    view.close()
    dropper.send("open", "let-go", dropper.proof())
    assert dropper.receive() == ["absent"]
    holder.close()
    dropper.close()
