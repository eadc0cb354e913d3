"""The two Jupyter websocket framings, both ways, and the kernel-side wire checks.

Legacy (no subprotocol): one JSON object ``{"header", "parent_header", "metadata", "content",
"buffers", "channel"}`` in a text frame, or, when it has binary buffers, a binary frame: a
big-endian uint32 count *n* (the JSON part plus each buffer), *n* uint32 offsets, then the JSON
(without ``buffers``) and the buffers at those offsets.

``v1.kernel.websocket.jupyter.org``: one binary frame, a little-endian uint64 count *n*, *n*
uint64 offsets, then the channel name and the message's parts as raw JSON (header, parent
header, metadata, content) followed by its buffers. JupyterLab offers it first.

Messages keep their JSON parts raw end to end where they can: a kernel message is spliced into
a frame without parsing its content, and a v1 client message is signed and sent as it came.
"""

from __future__ import annotations

import hmac
import itertools
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import InvalidRequest

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
CLIENT_CHANNELS = frozenset({"shell", "control", "stdin"})
DELIMITER = b"<IDS|MSG>"
_REQUIRED_DICTS = ("header", "parent_header", "metadata", "content")


class MalformedFrame(InvalidRequest):
    """A websocket frame that is not a valid Jupyter message."""

    reason = "malformed-message"


class BadSignature(InvalidRequest):
    """A ZMQ message whose HMAC does not match the kernel's key."""

    reason = "bad-signature"


@dataclass
class ClientMessage:
    """A message from a websocket client, checked, as the four JSON parts a kernel expects."""

    channel: str
    msg_type: str
    msg_id: str
    parts: list[bytes]  # header, parent_header, metadata, content: raw JSON
    buffers: list[bytes] = field(default_factory=list)


def parse_client_frame(frame: str | bytes, protocol: str | None = None) -> ClientMessage:
    """Decode one websocket frame from a client; raises `MalformedFrame` saying what is wrong."""
    if protocol == V1_PROTOCOL:
        return _parse_v1_frame(frame)
    buffers: list[bytes] = []
    if isinstance(frame, bytes):
        json_bytes, buffers = _split_binary_frame(frame)
        text: str | bytes = json_bytes
    else:
        text = frame
    try:
        msg = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedFrame(f"the frame is not valid JSON: {e}") from None
    if not isinstance(msg, dict):
        raise MalformedFrame("the frame must hold a JSON object")
    # jupyter_server's own gateway client sends no channel; its servers read that as shell.
    channel = _checked_channel(msg.get("channel") or "shell")
    for key in _REQUIRED_DICTS:
        if not isinstance(msg.setdefault(key, {}), dict):
            raise MalformedFrame(f"'{key}' must be a JSON object")
    if msg.get("buffers") and not buffers:
        raise MalformedFrame("buffers must travel in a binary frame, not inside the JSON")
    msg_type = _checked_header(msg["header"])
    parts = [json.dumps(msg[key], default=str).encode() for key in _REQUIRED_DICTS]
    return ClientMessage(channel, msg_type, msg["header"]["msg_id"], parts, buffers)


def _parse_v1_frame(frame: str | bytes) -> ClientMessage:
    if not isinstance(frame, bytes):
        raise MalformedFrame("the v1 protocol sends binary frames only")
    if len(frame) < 8:
        raise MalformedFrame("a v1 frame needs at least its offset count")
    count = int.from_bytes(frame[:8], "little")
    if count < 6 or 8 * (count + 1) > len(frame):
        raise MalformedFrame(f"a v1 frame declares {count} offsets but is {len(frame)} bytes long")
    offsets = [int.from_bytes(frame[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
    if offsets[0] != 8 * (count + 1) or offsets[-1] != len(frame) or offsets != sorted(offsets):
        raise MalformedFrame(f"a v1 frame has inconsistent offsets {offsets}")
    pieces = [frame[a:b] for a, b in itertools.pairwise(offsets)]
    try:
        channel = _checked_channel(pieces[0].decode())
        header = json.loads(pieces[1])
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedFrame(f"a v1 frame's channel or header is not readable: {e}") from None
    if not isinstance(header, dict):
        raise MalformedFrame("'header' must be a JSON object")
    msg_type = _checked_header(header)
    return ClientMessage(channel, msg_type, header["msg_id"], pieces[1:5], pieces[5:])


def _checked_channel(channel: Any) -> str:
    if channel not in CLIENT_CHANNELS:
        raise MalformedFrame(
            f"unknown channel {channel!r}; a client sends on shell, control or stdin"
        )
    return str(channel)


def _checked_header(header: dict[str, Any]) -> str:
    """The message type, once the header has the fields a kernel needs."""
    for key in ("msg_id", "msg_type"):
        if not isinstance(header.get(key), str) or not header[key]:
            raise MalformedFrame(f"the header needs a non-empty string '{key}'")
    return str(header["msg_type"])


def _split_binary_frame(frame: bytes) -> tuple[bytes, list[bytes]]:
    if len(frame) < 8:
        raise MalformedFrame("a binary frame needs at least a count and one offset")
    (count,) = struct.unpack_from("!I", frame, 0)
    header_end = 4 * (count + 1)
    if count < 1 or header_end > len(frame):
        raise MalformedFrame(
            f"a binary frame declares {count} parts but is {len(frame)} bytes long"
        )
    offsets = list(struct.unpack_from(f"!{count}I", frame, 4))
    bounds = [*offsets, len(frame)]
    if offsets[0] != header_end or any(a > b for a, b in itertools.pairwise(bounds)):
        raise MalformedFrame(f"a binary frame has inconsistent offsets {offsets}")
    parts = [frame[a:b] for a, b in itertools.pairwise(bounds)]
    return parts[0], parts[1:]


def v1_frame(channel: str, parts: list[bytes], buffers: list[bytes]) -> bytes:
    """A ``v1.kernel.websocket.jupyter.org`` frame: uint64 count, uint64 offsets, the pieces."""
    pieces = [channel.encode(), *parts, *buffers]
    offsets = [8 * (len(pieces) + 2)]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    head = len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    return b"".join([head, *pieces])


def binary_frame(json_part: bytes, buffers: list[bytes]) -> bytes:
    parts = [json_part, *buffers]
    offsets = [4 * (len(parts) + 1)]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + len(part))
    return b"".join([struct.pack(f"!{len(parts) + 1}I", len(parts), *offsets), *parts])


@dataclass
class KernelMessage:
    """A signed message from a kernel, verified, with its JSON parts still raw."""

    header: dict[str, Any]
    raw_header: bytes
    raw_parent_header: bytes
    raw_metadata: bytes
    raw_content: bytes
    buffers: list[bytes]

    @property
    def msg_type(self) -> str:
        return str(self.header.get("msg_type", ""))

    def to_client_frame(self, channel: str, protocol: str | None = None) -> str | bytes:
        """The websocket frame for this message in the client's framing."""
        if protocol == V1_PROTOCOL:
            return v1_frame(channel, self.raw_parts, self.buffers)
        return self.to_legacy_frame(channel)

    def parent_msg_id(self) -> str | None:
        """The msg_id of the request this message answers (parses the parent header)."""
        try:
            parent = json.loads(self.raw_parent_header)
        except ValueError:
            return None
        return parent.get("msg_id") if isinstance(parent, dict) else None

    @property
    def raw_parts(self) -> list[bytes]:
        return [self.raw_header, self.raw_parent_header, self.raw_metadata, self.raw_content]

    def to_legacy_frame(self, channel: str) -> str | bytes:
        """The legacy websocket frame for this message, spliced from the raw parts.

        Like jupyter_server's frames it repeats ``msg_id`` and ``msg_type`` at the top level,
        which jupyter_server's own gateway client reads.
        """
        ids = json.dumps({"msg_id": self.header.get("msg_id"), "msg_type": self.msg_type})
        json_part = b"".join(
            [
                ids[:-1].encode(),
                b',"header":',
                self.raw_header,
                b',"parent_header":',
                self.raw_parent_header,
                b',"metadata":',
                self.raw_metadata,
                b',"content":',
                self.raw_content,
                b',"channel":"',
                channel.encode(),
                b'"',
            ]
        )
        if self.buffers:
            return binary_frame(json_part + b"}", self.buffers)
        return (json_part + b',"buffers":[]}').decode("utf-8")


def parse_kernel_frames(frames: list[bytes], signer: hmac.HMAC | None) -> KernelMessage:
    """Verify and split the ZMQ frames of one kernel message.

    `signer` is an HMAC object keyed with the kernel's key (copied per message), or None when the
    kernel runs without a key. Raises `BadSignature` or `MalformedFrame`.
    """
    try:
        start = frames.index(DELIMITER) + 1
    except ValueError:
        raise MalformedFrame("a kernel message without the <IDS|MSG> delimiter") from None
    if len(frames) - start < 5:
        raise MalformedFrame(
            f"a kernel message with {len(frames) - start} parts (at least 5 needed)"
        )
    signature, header, parent, metadata, content = frames[start : start + 5]
    if signer is not None:
        check = signer.copy()
        for part in (header, parent, metadata, content):
            check.update(part)
        if not hmac.compare_digest(check.hexdigest().encode(), signature):
            raise BadSignature("a kernel message failed its HMAC check and was dropped")
    try:
        header_dict = json.loads(header)
    except ValueError as e:
        raise MalformedFrame(f"a kernel message header is not JSON: {e}") from None
    return KernelMessage(
        header=header_dict if isinstance(header_dict, dict) else {},
        raw_header=header,
        raw_parent_header=parent,
        raw_metadata=metadata,
        raw_content=content,
        buffers=list(frames[start + 5 :]),
    )


def kernel_message_from_dict(msg: dict[str, Any]) -> KernelMessage:
    """A `KernelMessage` for a message the gateway itself publishes (a status change, say)."""

    def dump(key: str) -> bytes:
        return json.dumps(msg.get(key, {}), default=str).encode()

    return KernelMessage(
        header=msg["header"],
        raw_header=dump("header"),
        raw_parent_header=dump("parent_header"),
        raw_metadata=dump("metadata"),
        raw_content=dump("content"),
        buffers=[],
    )
