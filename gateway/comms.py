"""The comms open on one kernel, as the gateway sees them pass, and their end when their
replica stops being the kernel's executor.

A comm (an ipywidget, say) lives in one replica's process: the one that answered its
``comm_open`` (the primary, for a frontend's; the replica that published it, for the kernel's).
The other replicas never hear of it, and a comm's object does not travel in the namespace
sync. So when the kernel's executor changes (its replica was lost, moved, or a cell ran on
another replica) its comms are closed for the frontends: each gets a ``comm_close`` on IOPub,
and widgets show they are gone instead of going dead without a word.

`CommTable` only keeps the books; the `KernelLink` feeds it every comm message that crosses
it (`client_sent`, `kernel_sent`), asks it what to do with a frontend's comm message
(`unknown`), and tells it when the executor changes (`executor_changed`). A frontend's
``comm_msg`` or ``comm_close`` for a comm the table does not know (closed here already, or
never opened through this gateway) is not sent to a replica, which would drop it in silence:
the frontend gets a ``comm_close`` for that id instead (`close_message`).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from jupyter_client.session import Session

from kernelfleet.gateway.framing import KernelMessage, kernel_message_from_dict

log = logging.getLogger("kernelfleet.gateway.comms")

OPEN, MSG, CLOSE = "comm_open", "comm_msg", "comm_close"
COMM_TYPES = frozenset({OPEN, MSG, CLOSE})
CLOSED_KEPT = 256
"""Comms closed here whose ``comm_close`` a client that reconnects later still gets."""


@dataclass(frozen=True)
class Comm:
    comm_id: str
    target_name: str
    replica_id: str
    """The replica whose process holds it."""


def comm_id_of(raw_content: bytes) -> str | None:
    """The ``comm_id`` of a comm message's content, or None if it has none."""
    try:
        content = json.loads(raw_content)
    except ValueError:
        return None
    comm_id = content.get("comm_id") if isinstance(content, dict) else None
    return comm_id if isinstance(comm_id, str) and comm_id else None


def _target_of(raw_content: bytes) -> str:
    try:
        content = json.loads(raw_content)
    except ValueError:
        return ""
    return str(content.get("target_name", "")) if isinstance(content, dict) else ""


class CommTable:
    """One kernel link's open comms and the replica holding each; see the module docstring."""

    def __init__(self, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self._open: dict[str, Comm] = {}
        self._closed: deque[tuple[str, str]] = deque(maxlen=CLOSED_KEPT)  # (comm id, why)
        self._session = Session(username="kernelfleet")

    def __contains__(self, comm_id: str) -> bool:
        return comm_id in self._open

    def replica_of(self, comm_id: str) -> str | None:
        comm = self._open.get(comm_id)
        return comm.replica_id if comm is not None else None

    def client_sent(self, msg_type: str, raw_content: bytes, replica_id: str) -> None:
        """A frontend's comm message went to `replica_id`."""
        self._note(msg_type, raw_content, replica_id)

    def kernel_sent(self, msg_type: str, raw_content: bytes, replica_id: str) -> None:
        """`replica_id` published a comm message (IOPub) that the frontends were sent."""
        self._note(msg_type, raw_content, replica_id)

    def unknown(self, msg_type: str, raw_content: bytes) -> str | None:
        """For a frontend's ``comm_msg``/``comm_close``: its comm id if no replica holds that
        comm (the frontend must get `close_message` for it, and the message goes nowhere);
        None for a comm that is open, or a message that is no such comm message."""
        if msg_type not in (MSG, CLOSE):
            return None
        comm_id = comm_id_of(raw_content)
        if comm_id is None or comm_id in self._open:
            return None
        return comm_id

    def executor_changed(self, executor: str | None, live: set[str]) -> list[str]:
        """The kernel's executor is now `executor` (None: it has none); `live` are the replicas
        still linked. Every comm held by another replica is closed here; returns their ids."""
        gone = [c for c in self._open.values() if c.replica_id != executor]
        for comm in gone:
            del self._open[comm.comm_id]
            why = (
                f"its replica {comm.replica_id} was lost"
                if comm.replica_id not in live
                else f"the kernel's cells now run on replica {executor}, not {comm.replica_id}"
            )
            self._closed.append((comm.comm_id, why))
            log.info(
                "kernel %s: comm %s (%s) closed: %s",
                self.kernel_id, comm.comm_id, comm.target_name or "?", why,
            )  # fmt: skip
        return [comm.comm_id for comm in gone]

    def closed_earlier(self) -> list[str]:
        """The comms this table closed (the latest `CLOSED_KEPT`), for a client that attaches."""
        return [comm_id for comm_id, _ in self._closed]

    def close_message(self, comm_id: str, parent: dict[str, Any] | None = None) -> KernelMessage:
        """The IOPub ``comm_close`` a frontend gets for `comm_id`, saying why in its data."""
        why = next((w for c, w in self._closed if c == comm_id), None)
        if why is None:
            why = "no replica of this kernel holds it (it was closed, or opened elsewhere)"
        data = {"reason": f"kernelfleet closed comm {comm_id}: {why}"}
        msg = self._session.msg(
            CLOSE, content={"comm_id": comm_id, "data": data}, parent=parent or {}
        )
        return kernel_message_from_dict(msg)

    def _note(self, msg_type: str, raw_content: bytes, replica_id: str) -> None:
        comm_id = comm_id_of(raw_content)
        if comm_id is None:
            return
        if msg_type == OPEN:
            self._open[comm_id] = Comm(comm_id, _target_of(raw_content), replica_id)
        elif msg_type == CLOSE:
            self._open.pop(comm_id, None)
