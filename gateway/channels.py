"""The gateway's ZMQ link to one kernel replica.

`KernelLink` holds one IOPub subscription per kernel, made ready once (by nudging the kernel
until a message arrives) and fanned out to every attached client, so a websocket that opens can
execute at once without losing the first outputs. Each attached client gets its own DEALER
sockets for shell, control and stdin (`ClientLink`), so replies route back to the client that
asked. Messages from the kernel are HMAC-checked; a bad one is logged and dropped, never relayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from kernelfleet.errors import InvalidRequest, KernelStartFailed
from kernelfleet.gateway.framing import (
    DELIMITER,
    ClientMessage,
    KernelMessage,
    kernel_message_from_dict,
    parse_kernel_frames,
)

log = logging.getLogger("kernelfleet.gateway.channels")

Deliver = Callable[[str, KernelMessage], None]
"""Receives (channel, message) for each verified message from the kernel."""

OnClosed = Callable[[], None]
"""Called when the gateway closes a client's link (the kernel was relinked or shut down)."""


@dataclass(frozen=True)
class ConnectionInfo:
    """Where a kernel replica listens, and the key its messages are signed with."""

    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    transport: str = "tcp"
    signature_scheme: str = "hmac-sha256"

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> ConnectionInfo:
        fields = cls.__dataclass_fields__
        return cls(**{name: info[name] for name in fields if name in info})

    def url(self, channel: str) -> str:
        port = getattr(self, f"{channel}_port")
        return f"{self.transport}://{self.ip}:{port}"

    def session(self, session_id: str | None = None) -> Session:
        return Session(
            key=self.key.encode(),
            signature_scheme=self.signature_scheme,
            session=session_id or str(uuid.uuid4()),
            username="kernelfleet",
        )


class KernelLink:
    """The gateway side of one kernel replica's channels. Create, `await start()`, then `attach`."""

    def __init__(
        self,
        kernel_id: str,
        replica_id: str,
        info: ConnectionInfo,
        context: zmq.asyncio.Context,
        on_iopub: Callable[[KernelMessage], None],
    ) -> None:
        self.kernel_id = kernel_id
        self.replica_id = replica_id
        self.info = info
        self._context = context
        self._on_iopub = on_iopub
        self._session = info.session()
        self._clients: set[ClientLink] = set()
        self._iopub: zmq.asyncio.Socket | None = None
        self._pump: asyncio.Task[None] | None = None
        self._first_iopub = asyncio.Event()

    async def start(self, timeout: float = 10.0) -> None:
        """Subscribe to IOPub and nudge the kernel until the subscription demonstrably works."""
        self._iopub = self._context.socket(zmq.SUB)
        self._iopub.setsockopt(zmq.LINGER, 0)
        self._iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self._iopub.connect(self.info.url("iopub"))
        self._pump = asyncio.create_task(self._pump_iopub(), name=f"iopub-{self.kernel_id}")
        await self.nudge(timeout)

    async def nudge(self, timeout: float = 10.0) -> None:
        """Send ``kernel_info_request`` until something arrives on IOPub.

        Needed after subscribing, and again after the kernel process was replaced on the same
        ports (a restart): ZMQ reconnects the subscription by itself, but what the new process
        publishes before that reconnection is lost.
        """
        self._first_iopub.clear()
        nudge = self._context.socket(zmq.DEALER)
        nudge.setsockopt(zmq.LINGER, 0)
        nudge.connect(self.info.url("shell"))
        deadline = time.monotonic() + timeout
        try:
            while not self._first_iopub.is_set():
                if time.monotonic() > deadline:
                    raise KernelStartFailed(
                        f"kernel {self.kernel_id} published nothing on IOPub within {timeout:.0f} s"
                    )
                msg = self._session.msg("kernel_info_request")
                await nudge.send_multipart(self._session.serialize(msg))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._first_iopub.wait(), 0.2)
        finally:
            nudge.close()

    def attach(self, session_id: str, deliver: Deliver, on_closed: OnClosed) -> ClientLink:
        """Open a client's shell/control/stdin sockets; IOPub reaches it through `deliver` too.

        `on_closed` runs if the link closes the client (a relink or a shutdown), so the client
        can drop its websocket and reconnect; it does not run when the client closes itself.
        """
        client = ClientLink(self, session_id, deliver, on_closed)
        self._clients.add(client)
        return client

    def detach(self, client: ClientLink) -> None:
        self._clients.discard(client)

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def broadcast(self, channel: str, message: KernelMessage) -> None:
        for client in list(self._clients):
            client.deliver(channel, message)

    def close(self, why: str = "the kernel's link closed") -> None:
        """Close the link: each client's running cells get an error reply saying `why`, then
        the client is disconnected."""
        for client in list(self._clients):
            client.fail_pending(why)
            client.close()
            client.on_closed()
        if self._pump is not None:
            self._pump.cancel()
        if self._iopub is not None:
            self._iopub.close()

    async def _pump_iopub(self) -> None:
        assert self._iopub is not None
        async for message in _verified_messages(
            self._iopub, self._session, self.kernel_id, "iopub"
        ):
            self._first_iopub.set()
            self._on_iopub(message)
            self.broadcast("iopub", message)


class ClientLink:
    """One websocket client's DEALER sockets to a kernel replica."""

    def __init__(
        self, link: KernelLink, session_id: str, deliver: Deliver, on_closed: OnClosed
    ) -> None:
        self._link = link
        self.deliver = deliver
        self.on_closed = on_closed
        self._pending: dict[str, bytes] = {}  # execute_request msg_id -> its raw header
        self._session = link.info.session(session_id)
        context = link._context
        identity = f"{session_id}-{uuid.uuid4().hex[:8]}".encode()
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._pumps: list[asyncio.Task[None]] = []
        for channel in ("shell", "control", "stdin"):
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.connect(link.info.url(channel))
            self._sockets[channel] = socket
            self._pumps.append(asyncio.create_task(self._pump(channel, socket)))

    async def send(self, message: ClientMessage) -> None:
        """Sign `message` with the kernel's key and send it on its channel."""
        socket = self._sockets.get(message.channel)
        if socket is None:
            raise InvalidRequest(f"cannot send on channel {message.channel!r}")
        signature = self._session.sign(message.parts)
        if message.msg_type == "execute_request":
            self._pending[message.msg_id] = message.parts[0]
        await socket.send_multipart([DELIMITER, signature, *message.parts, *message.buffers])

    def fail_pending(self, why: str) -> None:
        """Answer every cell this client still waits for with an error and an idle status."""
        for raw_header in self._pending.values():
            parent = json.loads(raw_header)
            for msg_type, channel, content in (
                ("execute_reply", "shell", _lost_cell_reply(why)),
                ("status", "iopub", {"execution_state": "idle"}),
            ):
                msg = self._session.msg(msg_type, content=content, parent=parent)
                self.deliver(channel, kernel_message_from_dict(msg))
        self._pending.clear()

    def close(self) -> None:
        self._link.detach(self)
        for task in self._pumps:
            task.cancel()
        for socket in self._sockets.values():
            socket.close()

    async def _pump(self, channel: str, socket: zmq.asyncio.Socket) -> None:
        kernel_id = self._link.kernel_id
        async for message in _verified_messages(socket, self._session, kernel_id, channel):
            if channel == "shell" and message.msg_type == "execute_reply":
                self._pending.pop(message.parent_msg_id(), None)
            self.deliver(channel, message)


async def _verified_messages(
    socket: zmq.asyncio.Socket, session: Session, kernel_id: str, channel: str
):
    """Yield each message that arrives on `socket` and passes its HMAC check; log the others."""
    while True:
        try:
            frames = await socket.recv_multipart()
        except (asyncio.CancelledError, zmq.ZMQError):
            return
        try:
            message = parse_kernel_frames(frames, session.auth)
        except InvalidRequest as e:
            log.error(
                "kernel %s sent an invalid message on %s (%s): %s", kernel_id, channel, e.reason, e
            )
            continue
        yield message


def _lost_cell_reply(why: str) -> dict[str, Any]:
    evalue = f"{why}; the kernel goes on with the state of its last completed cell"
    return {
        "status": "error",
        "ename": "ReplicaLost",
        "evalue": evalue,
        "traceback": [f"ReplicaLost: {evalue}"],
        "execution_count": None,
    }
