"""The legacy websocket framing, checked against jupyter_server's own implementation."""

import hashlib
import hmac
import json

import pytest
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)

from kernelfleet.gateway.framing import (
    V1_PROTOCOL,
    BadSignature,
    MalformedFrame,
    kernel_message_from_dict,
    parse_client_frame,
    parse_kernel_frames,
)


def client_msg(**extra):
    msg = Session().msg("execute_request", content={"code": "1"})
    msg.update(channel="shell", buffers=[], **extra)
    return msg


def parts_as_dicts(parsed):
    return [json.loads(part) for part in parsed.parts]


def test_text_frame_round_trip():
    msg = client_msg()
    parsed = parse_client_frame(json.dumps(msg, default=str))
    assert parsed.channel == "shell"
    assert parsed.msg_type == "execute_request"
    header, parent, metadata, content = parts_as_dicts(parsed)
    assert header["msg_id"] == msg["header"]["msg_id"]
    assert (parent, metadata, content) == ({}, {}, {"code": "1"})
    assert parsed.buffers == []


def test_v1_frame_from_jupyter_server_is_understood_without_reencoding():
    msg = client_msg()
    parts = [
        json.dumps(msg[k], default=str).encode()
        for k in ("header", "parent_header", "metadata", "content")
    ]
    frame = serialize_msg_to_ws_v1([*parts, b"\x00\xffbuf"], "control")
    parsed = parse_client_frame(frame, V1_PROTOCOL)
    assert (parsed.channel, parsed.msg_type) == ("control", "execute_request")
    assert parsed.parts == parts
    assert parsed.buffers == [b"\x00\xffbuf"]


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        ("text", "binary frames only"),
        (b"\x01", "offset count"),
        ((99).to_bytes(8, "little") + b"\x00" * 8, "declares 99 offsets"),
        (serialize_msg_to_ws_v1([b"{}"] * 4, "iopub"), "unknown channel 'iopub'"),
        (serialize_msg_to_ws_v1([b"{}"] * 4, "shell"), "msg_id"),
        (serialize_msg_to_ws_v1([b"not json", b"{}", b"{}", b"{}"], "shell"), "not readable"),
    ],
)
def test_malformed_v1_frames_say_what_is_wrong(frame, complaint):
    with pytest.raises(MalformedFrame, match=complaint):
        parse_client_frame(frame, V1_PROTOCOL)


def test_kernel_message_as_v1_frame_is_what_jupyter_server_reads():
    session = Session(key=b"secret")
    msg = session.msg("stream", content={"name": "stdout", "text": "héllo\n"})
    parsed = parse_kernel_frames(signed_frames(session, msg, [b"\x01\x02"]), session.auth)
    channel, pieces = deserialize_msg_from_ws_v1(parsed.to_client_frame("iopub", V1_PROTOCOL))
    assert channel == "iopub"
    assert json.loads(pieces[3]) == {"name": "stdout", "text": "héllo\n"}
    assert pieces[4:] == [b"\x01\x02"]


def test_missing_channel_means_shell_as_in_jupyter_server():
    msg = client_msg()
    del msg["channel"]
    assert parse_client_frame(json.dumps(msg, default=str)).channel == "shell"


def test_binary_frame_from_jupyter_server_is_understood():
    msg = client_msg()
    msg["buffers"] = [b"\x00\xffraw", b"", b"x" * 1000]
    parsed = parse_client_frame(serialize_binary_message(msg))
    assert parsed.buffers == [b"\x00\xffraw", b"", b"x" * 1000]
    assert parts_as_dicts(parsed)[3] == {"code": "1"}


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"header": {}, "channel": "iopub"}), "unknown channel"),
        (json.dumps({"channel": "shell", "header": {"msg_type": "x"}}), "msg_id"),
        (
            json.dumps(
                {"channel": "shell", "header": {"msg_id": "1", "msg_type": "x"}, "content": 3}
            ),
            "content",
        ),
        (b"\x00\x00\x00\x05\x00", "at least"),
        (b"\x00\x00\x00\x09\x00\x00\x00\x08", "declares 9 parts"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x04{}", "inconsistent offsets"),
    ],
)
def test_malformed_frames_say_what_is_wrong(frame, complaint):
    with pytest.raises(MalformedFrame, match=complaint):
        parse_client_frame(frame)


def signed_frames(session, msg, buffers=()):
    return [b"ident", *session.serialize(msg), *buffers]


def test_kernel_message_is_verified_and_spliced_without_reencoding():
    session = Session(key=b"secret")
    msg = session.msg("stream", content={"name": "stdout", "text": "héllo\n"})
    parsed = parse_kernel_frames(signed_frames(session, msg), session.auth)
    frame = json.loads(parsed.to_client_frame("iopub"))
    assert frame["channel"] == "iopub"
    assert frame["content"] == {"name": "stdout", "text": "héllo\n"}
    assert frame["header"]["msg_id"] == frame["msg_id"] == msg["header"]["msg_id"]
    assert frame["msg_type"] == "stream"
    assert frame["buffers"] == []


def test_kernel_message_with_buffers_becomes_a_binary_frame():
    session = Session(key=b"secret")
    msg = session.msg("comm_msg", content={"comm_id": "c", "data": {}})
    parsed = parse_kernel_frames(
        signed_frames(session, msg, [b"\x01\x02", b"\xff" * 10]), session.auth
    )
    decoded = deserialize_binary_message(parsed.to_client_frame("iopub"))
    assert decoded["buffers"] == [b"\x01\x02", b"\xff" * 10]
    assert decoded["content"]["comm_id"] == "c"


def test_bad_signature_is_refused():
    kernel, forger = Session(key=b"secret"), Session(key=b"not-the-key")
    frames = signed_frames(forger, forger.msg("stream", content={"name": "stdout", "text": "x"}))
    with pytest.raises(BadSignature):
        parse_kernel_frames(frames, kernel.auth)


def test_missing_delimiter_is_malformed():
    with pytest.raises(MalformedFrame, match="delimiter"):
        parse_kernel_frames([b"a", b"b"], hmac.new(b"k", digestmod=hashlib.sha256))


def test_gateway_status_message_encodes():
    msg = Session().msg("status", content={"execution_state": "dead"})
    frame = json.loads(kernel_message_from_dict(msg).to_client_frame("iopub"))
    assert frame["content"]["execution_state"] == "dead"
