"""Telling a frozen replica from a busy one: its heartbeat channel.

A replica whose process is stopped (SIGSTOP, a debugger, a wedged host) neither exits nor
answers; its host agent still reports it running and its host still links. Left alone, its
kernel's next cell waits for it as long as it is frozen. ipykernel echoes the heartbeat
channel on a thread of its own, in ZMQ's C code, so a cell that computes for hours does not
stop the echo; a stopped process does. `HeartbeatWatch` pings the channel and calls its
`on_silent` once when no echo came for `timeout` seconds; the gateway then fences the replica
(stops it through its agent) and treats it as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from kernelfleet.protocol import ConnectionInfo

PING_INTERVAL = 0.5
"""Seconds between pings."""
SILENCE_TIMEOUT = 6.0
"""Seconds without an echo after which a replica is called silent: well above what a loaded
machine delays a thread in C (the echo needs no GIL), well below what a user waits for."""


class HeartbeatWatch:
    """Pings one replica's heartbeat channel until `stop`; calls `on_silent(seconds)` when no
    echo came for `timeout` seconds, and again every `timeout` seconds of further silence (the
    callee may not act while its kernel restarts). Starts counting from its first echo, so a
    replica that never answered is not called silent by it (the launch times it out)."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        info: ConnectionInfo,
        on_silent: Callable[[float], None],
        interval: float = PING_INTERVAL,
        timeout: float = SILENCE_TIMEOUT,
    ) -> None:
        self._context = context
        self._url = info.url("hb")
        self._on_silent = on_silent
        self._interval = interval
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None
        self._current: zmq.asyncio.Socket | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Stop pinging; the socket closes at once (a ZMQ context cannot terminate while one
        of its sockets is open, and the gateway terminates its context right after)."""
        if self._task is not None:
            self._task.cancel()
        if self._current is not None:
            self._current.close(linger=0)

    async def _run(self) -> None:
        last_echo: float | None = None
        socket = self._socket()
        try:
            while True:
                sent = time.monotonic()
                await socket.send(b"ping")
                if await socket.poll(self._interval * 1000):
                    await socket.recv()
                    last_echo = time.monotonic()
                    await asyncio.sleep(max(0.0, self._interval - (last_echo - sent)))
                else:  # a REQ socket waits for its answer: start again with a fresh one
                    socket.close(linger=0)
                    socket = self._socket()
                if last_echo is not None and time.monotonic() - last_echo > self._timeout:
                    self._on_silent(time.monotonic() - last_echo)
                    last_echo = time.monotonic()
        finally:
            with contextlib.suppress(zmq.ZMQError):
                socket.close(linger=0)

    def _socket(self) -> zmq.asyncio.Socket:
        socket = self._current = self._context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self._url)
        return socket
