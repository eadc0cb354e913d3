"""The messages of a coordinated group: consumers <-> coordinator <-> producer.

A message is a tuple whose first item names it. On a stream socket it travels as a 4-byte
big-endian length followed by the pickled tuple. Pickle is safe here because every peer runs as
the same user (the coordinator checks each consumer's ``SO_PEERCRED``), who may run any code anyway.

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

import pickle
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")

Message = tuple[Any, ...]


class ConnectionClosed(EOFError):
    """The peer closed its end of the socket (or died)."""


def encode(message: Message) -> bytes:
    """The bytes of one framed message."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into messages; keeps a partial frame until the rest arrives."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """Adds ``data`` and returns the messages now complete, in order."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            messages.append(pickle.loads(self._buffer[HEADER.size : end]))
            del self._buffer[:end]
        return messages


class Channel:
    """A blocking stream socket that sends and receives whole messages, every wait bounded.

    A receive that times out raises `TimeoutError` and loses nothing: a partial frame stays
    buffered for the next call.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._reader = FrameReader()
        self._ready: list[Message] = []

    def send(self, message: Message, timeout: float | None = None) -> None:
        """Sends one message; raises `ConnectionClosed` if the peer is gone."""
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(encode(message))
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
                data = self.sock.recv(1 << 16)
            except ConnectionResetError as error:
                raise ConnectionClosed(str(error)) from error
            if not data:
                raise ConnectionClosed("end of stream")
            self._ready.extend(self._reader.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        self.sock.close()
