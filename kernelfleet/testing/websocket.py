"""A kernel client over a websocket, speaking jupyter_server's framings with its own functions."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from jupyter_client.session import Session
from tornado.websocket import WebSocketClientConnection


@dataclass
class Reply:
    """What one request produced: the reply's content and the IOPub messages it caused."""

    reply: dict[str, Any]
    iopub: list[dict[str, Any]]

    @property
    def stdout(self) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.iopub
            if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["header"]["msg_type"] == msg_type]


V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"


class KernelWebsocket:
    """A kernel client over a websocket: sends requests, collects replies and IOPub by parent.

    Speaks the framing the server selected (``ws.selected_subprotocol``): v1 or legacy. It
    encodes and decodes with jupyter_server's own functions, independent of the gateway's code.
    """

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.protocol = ws.selected_subprotocol
        self.session = Session(username="test")
        self.unclaimed: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []

    def send(
        self,
        msg_type: str,
        content: dict[str, Any],
        channel: str = "shell",
        buffers: list[bytes] | None = None,
        metadata: dict[str, Any] | None = None,
        msg_id: str | None = None,
    ) -> str:
        """Send a request; `msg_id` reuses an id (to send a duplicate). Returns the msg_id."""
        from jupyter_server.services.kernels.connection.base import (
            serialize_binary_message,
            serialize_msg_to_ws_v1,
        )

        header = self.session.msg_header(msg_type)
        if msg_id is not None:
            header["msg_id"] = msg_id
        msg = self.session.msg(msg_type, content=content, header=header, metadata=metadata or {})
        if self.protocol == V1_PROTOCOL:
            parts = [self.session.pack(msg[key]) for key in ("header", "parent_header", "metadata")]
            parts.append(self.session.pack(content))
            self.ws.write_message(serialize_msg_to_ws_v1([*parts, *(buffers or [])], channel), True)
            return msg["header"]["msg_id"]
        msg["channel"] = channel
        if buffers:
            msg["buffers"] = buffers
            self.ws.write_message(serialize_binary_message(msg), binary=True)
        else:
            msg["buffers"] = []
            self.ws.write_message(json.dumps(msg, default=str))
        return msg["header"]["msg_id"]

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        from jupyter_server.services.kernels.connection.base import (
            deserialize_binary_message,
            deserialize_msg_from_ws_v1,
        )

        frame = await asyncio.wait_for(self.ws.read_message(), timeout)
        if frame is None:
            raise ConnectionError("the websocket closed")
        if self.protocol == V1_PROTOCOL:
            assert isinstance(frame, bytes), "v1 frames are binary"
            channel, pieces = deserialize_msg_from_ws_v1(frame)
            keys = ("header", "parent_header", "metadata", "content")
            msg = {key: json.loads(piece) for key, piece in zip(keys, pieces, strict=False)}
            return {**msg, "channel": channel, "buffers": pieces[4:]}
        if isinstance(frame, bytes):
            return deserialize_binary_message(frame)
        return json.loads(frame)

    async def request(
        self,
        msg_type: str,
        content: dict[str, Any],
        timeout: float = 30,
        channel: str = "shell",
        expect_reply: bool = True,
        **kwargs: Any,
    ) -> Reply:
        """Send a message; wait for its reply (unless it has none, as ``comm_msg``) and for the
        kernel to go idle after it."""
        msg_id = self.send(msg_type, content, channel=channel, **kwargs)
        return await self.collect(msg_id, timeout, channel, expect_reply)

    async def collect(
        self, msg_id: str, timeout: float = 30, channel: str = "shell", expect_reply: bool = True
    ) -> Reply:
        """Gather what request `msg_id` caused until its reply and the idle status arrived."""
        reply: dict[str, Any] | None = None if expect_reply else {}
        iopub: list[dict[str, Any]] = []
        idle = False
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            msg = await self._next_for(msg_id, deadline)
            if msg["channel"] == "iopub":
                iopub.append(msg)
                if (
                    msg["header"]["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                ):
                    idle = True
            elif msg["channel"] == channel:
                reply = msg["content"]
        assert reply is not None
        return Reply(reply, iopub)

    async def wait_for_output(self, msg_id: str, text: str, timeout: float = 30) -> None:
        """Wait until request `msg_id` printed `text`; its other messages stay to be collected."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        try:
            while True:
                msg = await self._next_for(msg_id, deadline)
                seen.append(msg)
                if msg["header"]["msg_type"] == "stream" and text in msg["content"]["text"]:
                    return
        finally:
            self._pending = seen + self._pending

    async def _next_for(self, msg_id: str, deadline: float) -> dict[str, Any]:
        """The next message whose parent is `msg_id`; others are kept in ``unclaimed``."""
        for index, msg in enumerate(self._pending):
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return self._pending.pop(index)
        while True:
            msg = await self.receive(max(0.01, deadline - time.monotonic()))
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg
            self.unclaimed.append(msg)

    async def execute(self, code: str, timeout: float = 30, **kwargs: Any) -> Reply:
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        return await self.request("execute_request", content, timeout=timeout, **kwargs)

    def close(self) -> None:
        self.ws.close()
