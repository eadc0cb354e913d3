"""The cells a notebook client sent through the gateway relay and still waits for.

When the relay loses the gateway (it was killed, or the network failed), no reply to those cells
can come: a gateway started again does not know them. JupyterLab would show them at ``[*]``
for ever. `CellsInFlight` remembers each ``execute_request`` the client sends until its
``execute_reply`` passes back, and `fail_all` answers the rest as a kernel answers a failed
cell: an IOPub ``error`` (shown in the cell's output), an error ``execute_reply``, an ``idle``
status. `status_frame` makes the relay's own status message (``dead``, once it gives up).

Frames are read and made in the framing the client chose: ``v1.kernel.websocket.jupyter.org``
(binary) or legacy (JSON text; binary when a message has buffers). Only frames that name
``execute_request`` or ``execute_reply`` are parsed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)

log = logging.getLogger("kernelfleet.extension.relay")

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"

GATEWAY_UNREACHABLE = "GatewayUnreachable"
"""The ``ename`` of a cell failed because the gateway was lost (as `kernelfleet.client` names
a gateway that does not answer)."""

Frame = str | bytes


class CellsInFlight:
    """One client websocket's cells in flight; see the module docstring."""

    def __init__(self, protocol: str | None) -> None:
        self._v1 = protocol == V1_PROTOCOL
        self._pending: dict[str, dict[str, Any]] = {}  # msg_id -> the request's header
        self._session = Session(username="kernelfleet")

    def __len__(self) -> int:
        return len(self._pending)

    def sent(self, frame: Frame) -> None:
        """The client sent `frame` towards the kernel."""
        if _names(frame, "execute_request"):
            read = self._read(frame)
            if read is not None and read[1].get("msg_type") == "execute_request":
                self._pending[str(read[1].get("msg_id"))] = read[1]

    def answered(self, frame: Frame) -> None:
        """`frame` came from the kernel, on its way to the client."""
        if self._pending and _names(frame, "execute_reply"):
            read = self._read(frame)
            if read is not None and read[1].get("msg_type") == "execute_reply":
                self._pending.pop(str(read[2].get("msg_id")), None)

    def fail_all(self, why: str) -> list[Frame]:
        """The frames that end every cell in flight with a `GATEWAY_UNREACHABLE` error saying
        `why`, in order; they are no longer in flight."""
        frames: list[Frame] = []
        error = {
            "ename": GATEWAY_UNREACHABLE,
            "evalue": why,
            "traceback": [f"{GATEWAY_UNREACHABLE}: {why}"],
        }
        for parent in self._pending.values():
            reply = {"status": "error", **error, "execution_count": None}
            frames.append(self._frame("iopub", "error", error, parent))
            frames.append(self._frame("shell", "execute_reply", reply, parent))
            frames.append(self._frame("iopub", "status", {"execution_state": "idle"}, parent))
        self._pending.clear()
        return frames

    def status_frame(self, execution_state: str) -> Frame:
        """An IOPub status message of the relay's own, with no parent."""
        return self._frame("iopub", "status", {"execution_state": execution_state}, {})

    # ---- framing -------------------------------------------------------------------------

    def _frame(
        self, channel: str, msg_type: str, content: dict[str, Any], parent: dict[str, Any]
    ) -> Frame:
        msg = self._session.msg(msg_type, content=content, parent=parent)
        if self._v1:
            keys = ("header", "parent_header", "metadata", "content")
            return serialize_msg_to_ws_v1([self._session.pack(msg[key]) for key in keys], channel)
        msg["channel"] = channel
        msg["buffers"] = []
        return self._session.pack(msg).decode()

    def _read(self, frame: Frame) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """(channel, header, parent_header) of a shell message, None for any other frame or
        one that cannot be read."""
        if isinstance(frame, bytes) and not _offsets_fit(frame, 8 if self._v1 else 4):
            return None
        try:
            if self._v1 and isinstance(frame, bytes):
                channel, parts = deserialize_msg_from_ws_v1(frame)
                header, parent = json.loads(parts[0]), json.loads(parts[1])
            else:
                msg = (
                    deserialize_binary_message(frame)
                    if isinstance(frame, bytes)
                    else json.loads(frame)
                )
                channel, header, parent = msg.get("channel"), msg["header"], msg["parent_header"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            log.debug("the relay could not read a frame it watches for cells: %s", e)
            return None
        if channel != "shell" or not isinstance(header, dict) or not isinstance(parent, dict):
            return None
        return channel, header, parent


def _offsets_fit(frame: bytes, width: int) -> bool:
    """Whether the binary frame's leading count of `width`-byte offsets fits in it (checked
    before jupyter_server's decoders, which trust it)."""
    count = int.from_bytes(frame[:width], "little" if width == 8 else "big")
    return count > 0 and width * (count + 1) <= len(frame)


def _names(frame: Frame, msg_type: str) -> bool:
    """Whether `frame` mentions `msg_type` at all (the cheap test before parsing it)."""
    if isinstance(frame, bytes):
        return msg_type.encode() in frame
    return msg_type in frame
