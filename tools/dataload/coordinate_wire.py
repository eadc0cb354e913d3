"""The messages of a coordinated group: consumers <-> coordinator <-> producer.

A message is a tuple whose first item names it. On a stream socket it travels as a 4-byte
big-endian length followed by the pickled tuple. Pickle is safe here because every peer runs as
the same user (the coordinator checks each consumer's ``SO_PEERCRED``), who may run any code anyway.

A *shared* group's consumers may run as other users (`share`), so between them and the
coordinator a message is a JSON array instead (at most `MAX_SHARED_FRAME` bytes; anything else
raises `ProtocolError`), batches travel in `tensor_format`, and a connection starts with a mutual
proof of the share key: coordinator ``("challenge", nonce)``, consumer ``("prove", nonce,
proof)``, coordinator ``("proven", proof)`` (or ``("error", text)``). The ``welcome`` of a shared
group carries the slots as read-only file descriptors (``SCM_RIGHTS``), not paths, and a batch's
``meta`` is the byte length of its encoding in the slot.

Consumer -> coordinator: ``("join", signature, pid)`` once; ``("epoch", e)`` when it starts epoch
``e``; ``("took", seq)`` when it has copied batch ``seq`` out of its slot; ``("skip", e)`` when it
abandons the rest of epoch ``e``; closing the socket leaves the group.

Coordinator -> consumer: ``("joined", n, k)`` while the group fills; ``("welcome", info)`` once all
``k`` joined; ``("batch", seq, epoch, index, slot, meta, prepared)``; ``("end", epoch, batches,
prepared)``; ``("error", text)``, after which the coordinator closes the socket.

Coordinator -> producer: ``("free", slot)`` and ``("epoch", e)``. Producer -> coordinator:
``("batch", seq, epoch, index, slot, meta, prepared)``, ``("end", epoch, batches, prepared)`` and
``("error", text)``. ``prepared`` is ``(batches, items)``: what the producer has made so far.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
MAX_SHARED_FRAME = 1 << 20
MAX_FDS = 16

Message = tuple[Any, ...]


class ConnectionClosed(EOFError):
    """The peer closed its end of the socket (or died)."""


class ProtocolError(ValueError):
    """A shared group's peer sent a frame that is not a message."""


def encode(message: Message, shared: bool = False) -> bytes:
    """The bytes of one framed message (JSON in a shared group, else pickled)."""
    if shared:
        body = json.dumps(message, allow_nan=False).encode()
    else:
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _from_json(frame: bytes) -> Message:
    try:
        message = json.loads(frame.decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"a frame that is not JSON: {error}") from None
    if not (isinstance(message, list) and message and isinstance(message[0], str)):
        raise ProtocolError(f"a frame that is not a message: {frame[:60]!r}")
    return tuple(message)


class FrameReader:
    """Cuts a byte stream into messages; keeps a partial frame until the rest arrives.

    ``shared``: frames are JSON, at most `MAX_SHARED_FRAME` bytes, checked (`ProtocolError`).
    """

    def __init__(self, shared: bool = False) -> None:
        self.shared = shared
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """Adds ``data`` and returns the messages now complete, in order."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if self.shared and length > MAX_SHARED_FRAME:
                raise ProtocolError(f"a frame of {length} bytes (at most {MAX_SHARED_FRAME})")
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            frame = bytes(self._buffer[HEADER.size : end])
            messages.append(_from_json(frame) if self.shared else pickle.loads(frame))
            del self._buffer[:end]
        return messages


class Channel:
    """A blocking stream socket that sends and receives whole messages, every wait bounded.

    A receive that times out raises `TimeoutError` and loses nothing: a partial frame stays
    buffered for the next call. ``shared``: JSON frames (see the module), and file descriptors
    that come with them are kept in `fds`, in order, for the caller to take.
    """

    def __init__(self, sock: socket.socket, shared: bool = False) -> None:
        self.sock = sock
        self.shared = shared
        self.fds: list[int] = []
        self._reader = FrameReader(shared)
        self._ready: list[Message] = []

    def send(self, message: Message, timeout: float | None = None) -> None:
        """Sends one message; raises `ConnectionClosed` if the peer is gone."""
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(encode(message, self.shared))
        except (BrokenPipeError, ConnectionResetError) as error:
            raise ConnectionClosed(str(error)) from error

    def receive(self, timeout: float | None) -> Message:
        """The next message, waiting at most ``timeout`` seconds (None: no limit).

        Raises `TimeoutError` when none came in time and `ConnectionClosed` at end of stream.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no message within {timeout:g} s")
            self.sock.settimeout(remaining)
            try:
                if self.shared:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, MAX_FDS)
                    self.fds.extend(fds)
                else:
                    data = self.sock.recv(1 << 16)
            except ConnectionResetError as error:
                raise ConnectionClosed(str(error)) from error
            if not data:
                raise ConnectionClosed("end of stream")
            self._ready.extend(self._reader.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        self.sock.close()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
