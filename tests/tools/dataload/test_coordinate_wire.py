"""The coordinated group's wire format and shared-memory batch layout, in one process."""

from __future__ import annotations

import collections
import os
import socket
from pathlib import Path

import pytest
import torch

from kernelfleet.tools.dataload.coordinate_batches import read_batch, write_batch
from kernelfleet.tools.dataload.coordinate_wire import (
    Channel,
    ConnectionClosed,
    FrameReader,
    encode,
)

Pair = collections.namedtuple("Pair", "image label")


def test_frames_cut_at_any_byte() -> None:
    messages = [
        ("join", {"batch_size": 4}, 123),
        ("took", 7),
        ("batch", 0, 1, 2, 3, b"\x00" * 300, (1, 4)),
    ]
    stream = b"".join(encode(m) for m in messages)
    reader = FrameReader()
    received = []
    for i in range(0, len(stream), 5):
        received += reader.feed(stream[i : i + 5])
    assert received == messages


def test_a_receive_that_times_out_keeps_the_partial_frame() -> None:
    mine, theirs = socket.socketpair()
    channel = Channel(mine)
    frame = encode(("epoch", 3))
    theirs.sendall(frame[:3])
    with pytest.raises(TimeoutError):
        channel.receive(timeout=0.05)
    theirs.sendall(frame[3:])
    assert channel.receive(timeout=1) == ("epoch", 3)
    theirs.close()
    with pytest.raises(ConnectionClosed):
        channel.receive(timeout=1)
    channel.close()


def test_a_batch_comes_back_equal_from_its_slot(tmp_path: Path) -> None:
    batch = {
        "image": torch.randn(3, 4, 5),
        "parts": [torch.tensor(7), torch.zeros(0, 5), torch.ones(2, dtype=torch.bfloat16)],
        "pair": Pair(torch.tensor([True, False]), torch.arange(10)[::3]),
        "name": "a string",
        "sparse": torch.eye(3).to_sparse(),
        "n": 7,
    }
    fd = os.open(tmp_path / "slot", os.O_RDWR | os.O_CREAT, 0o600)
    meta = write_batch(fd, batch)
    back = read_batch(fd, meta)
    os.close(fd)
    assert (back["name"], back["n"]) == ("a string", 7)
    assert isinstance(back["pair"], Pair)
    for key in ("image", "parts", "pair"):
        torch.testing.assert_close(back[key], batch[key])
    assert back["parts"][2].dtype == torch.bfloat16
    torch.testing.assert_close(back["sparse"].to_dense(), torch.eye(3))
    back["image"].add_(1)  # the caller owns its copy: the slot is unchanged
    fd = os.open(tmp_path / "slot", os.O_RDONLY)
    torch.testing.assert_close(read_batch(fd, meta)["image"], batch["image"])
    os.close(fd)


def test_a_slot_grows_for_a_larger_batch_and_is_reused(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "slot", os.O_RDWR | os.O_CREAT, 0o600)
    small = torch.arange(4.0)
    write_batch(fd, small)
    large = torch.arange(10_000.0)
    meta = write_batch(fd, large)
    assert os.fstat(fd).st_size >= large.numel() * 4
    torch.testing.assert_close(read_batch(fd, meta), large)
    meta = write_batch(fd, small)
    torch.testing.assert_close(read_batch(fd, meta), small)
    os.close(fd)
