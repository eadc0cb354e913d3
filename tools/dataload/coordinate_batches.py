"""A collated batch in a shared-memory slot: tensors as raw bytes, the rest as a pickled skeleton.

A slot is a file in ``/dev/shm`` (tmpfs, so its pages are shared memory). `write_batch` puts
every dense CPU tensor of the batch, wherever it sits in nested lists, tuples (named ones too) and
dicts, into the slot's file at 64-byte aligned offsets, growing the file when needed, and returns
``meta``: the batch with each tensor replaced by a `TensorRef`, pickled. `read_batch` gives back
an equal batch whose tensors are fresh copies the caller owns, so the slot can be reused at once.
Anything else in the batch (numbers, strings, sparse tensors) travels inside ``meta``.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch

ALIGNMENT = 64


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes lie in a slot, and what they are."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _is_plain(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.is_quantized
    )


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat uint8 tensor (a view where the tensor is contiguous)."""
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def _map(value: Any, leaf: Any) -> Any:
    """``value`` with each plain tensor replaced by ``leaf(tensor)``, containers rebuilt."""
    if _is_plain(value):
        return leaf(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_map(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, leaf) for item in value)
    if isinstance(value, dict):
        return type(value)((key, _map(item, leaf)) for key, item in value.items())
    return value


def write_all(fd: int, data: memoryview, offset: int) -> None:
    """Writes all of ``data`` at ``offset`` of the file ``fd``."""
    while data:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written


def read_all(fd: int, into: memoryview, offset: int) -> None:
    """Fills ``into`` from ``offset`` of the file ``fd``; raises `EOFError` if it ends first."""
    while into:
        count = os.preadv(fd, [into], offset)
        if count == 0:
            raise EOFError(f"slot ended {len(into)} bytes early at offset {offset}")
        into = into[count:]
        offset += count


def write_batch(fd: int, batch: Any) -> bytes:
    """Writes ``batch``'s tensors into the slot file ``fd``; returns its pickled skeleton."""
    chunks: list[tuple[int, torch.Tensor]] = []
    end = 0

    def place(tensor: torch.Tensor) -> TensorRef:
        nonlocal end
        data = _as_bytes(tensor)
        ref = TensorRef(end, data.numel(), tensor.dtype, tuple(tensor.shape))
        chunks.append((end, data))
        end += -(-data.numel() // ALIGNMENT) * ALIGNMENT
        return ref

    skeleton = _map(batch, place)
    if os.fstat(fd).st_size < end:
        os.ftruncate(fd, end)
    for offset, data in chunks:
        if data.numel():
            write_all(fd, data.numpy().data, offset)
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def read_batch(fd: int, meta: bytes) -> Any:
    """The batch that `write_batch` left in the slot file ``fd``, as new tensors."""

    def fetch(ref: TensorRef) -> torch.Tensor:
        tensor = torch.empty(ref.shape, dtype=ref.dtype)
        if ref.nbytes:
            read_all(fd, _as_bytes(tensor).numpy().data, ref.offset)
        return tensor

    return _unref(pickle.loads(meta), fetch)


def _unref(value: Any, fetch: Any) -> Any:
    if isinstance(value, TensorRef):
        return fetch(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_unref(item, fetch) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_unref(item, fetch) for item in value)
    if isinstance(value, dict):
        return type(value)((key, _unref(item, fetch)) for key, item in value.items())
    return value
