"""The legacy websocket framing, checked against jupyter_server's own implementation."""

import hashlib
import hmac
import json

import pytest
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    serialize_binary_message,
)

from kernelfleet.gateway.framing import (
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


def test_text_frame_round_trip():
    parsed = parse_client_frame(json.dumps(client_msg(), default=str))
    assert parsed.channel == "shell"
    assert parsed.msg_type == "execute_request"
    assert parsed.msg["content"] == {"code": "1"}
    assert parsed.buffers == []


def test_missing_channel_means_shell_as_in_jupyter_server():
    msg = client_msg()
    del msg["channel"]
    assert parse_client_frame(json.dumps(msg, default=str)).channel == "shell"


def test_binary_frame_from_jupyter_server_is_understood():
    msg = client_msg()
    msg["buffers"] = [b"\x00\xffraw", b"", b"x" * 1000]
    parsed = parse_client_frame(serialize_binary_message(msg))
    assert parsed.buffers == [b"\x00\xffraw", b"", b"x" * 1000]
    assert parsed.msg["content"] == {"code": "1"}


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"header": {}, "channel": "iopub"}), "channel"),
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
