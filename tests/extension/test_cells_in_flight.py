"""The relay's record of cells in flight, in both framings, with jupyter_server's own codecs."""

import json

import pytest
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)

from kernelfleet.extension.cells_in_flight import GATEWAY_UNREACHABLE, V1_PROTOCOL, CellsInFlight

SESSION = Session(username="lab")


def frame(protocol, msg_type, channel="shell", parent=None, buffers=()):
    msg = SESSION.msg(msg_type, content={"code": "1"}, parent=parent or {})
    if protocol == V1_PROTOCOL:
        keys = ("header", "parent_header", "metadata", "content")
        parts = [SESSION.pack(msg[key]) for key in keys]
        return msg, serialize_msg_to_ws_v1([*parts, *buffers], channel)
    msg["channel"] = channel
    msg["buffers"] = list(buffers)
    if buffers:
        return msg, serialize_binary_message(msg)
    return msg, SESSION.pack(msg).decode()


def read(protocol, data):
    """(channel, msg_type, parent msg_id, content) of a frame the relay made."""
    if protocol == V1_PROTOCOL:
        channel, parts = deserialize_msg_from_ws_v1(data)
        header, parent, _, content = (json.loads(p) for p in parts[:4])
    else:
        msg = json.loads(data)
        channel, header, parent, content = (
            msg[key] for key in ("channel", "header", "parent_header", "content")
        )
    return channel, header["msg_type"], parent.get("msg_id"), content


@pytest.mark.parametrize("protocol", [V1_PROTOCOL, None], ids=["v1", "legacy"])
def test_cells_without_a_reply_are_failed_as_a_kernel_fails_them(protocol):
    cells = CellsInFlight(protocol)
    answered, answered_frame = frame(protocol, "execute_request")
    waiting, waiting_frame = frame(protocol, "execute_request", buffers=[b"\x00\xff"])
    cells.sent(answered_frame)
    cells.sent(waiting_frame)
    cells.sent(frame(protocol, "kernel_info_request")[1])
    cells.sent(frame(protocol, "comm_msg", channel="iopub")[1])
    assert len(cells) == 2
    cells.answered(frame(protocol, "execute_reply", parent=answered["header"])[1])
    cells.answered(frame(protocol, "execute_reply", channel="iopub")[1])  # not a reply
    assert len(cells) == 1

    frames = cells.fail_all("the gateway is gone")
    assert [read(protocol, f)[:3] for f in frames] == [
        ("iopub", "error", waiting["header"]["msg_id"]),
        ("shell", "execute_reply", waiting["header"]["msg_id"]),
        ("iopub", "status", waiting["header"]["msg_id"]),
    ]
    reply = read(protocol, frames[1])[3]
    assert (reply["status"], reply["ename"]) == ("error", GATEWAY_UNREACHABLE)
    assert reply["evalue"] == "the gateway is gone"
    assert read(protocol, frames[2])[3] == {"execution_state": "idle"}
    assert len(cells) == 0
    assert cells.fail_all("again") == []

    dead = read(protocol, cells.status_frame("dead"))
    assert dead == ("iopub", "status", None, {"execution_state": "dead"})


def test_an_unreadable_frame_is_ignored():
    cells = CellsInFlight(V1_PROTOCOL)
    cells.sent(b"execute_request, but not a message")
    cells.sent("execute_request")
    legacy = CellsInFlight(None)
    legacy.sent(b"\x7f\xff\xff\xff execute_request")  # a count of buffers it does not hold
    assert len(cells) == len(legacy) == 0
