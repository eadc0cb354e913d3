"""A tensor-only format for data that crosses users: a JSON skeleton and raw bytes, no pickle.

What one user's process hands another (a coordinated group's batches, when its members run as
different users) must not be able to run code in the reader, so it is never unpickled. This
format carries exactly the values a collated minibatch is made of: dense CPU tensors of the
dtypes in `DTYPES`, inside lists, tuples and dicts (keys: str or int), and plain ints, floats,
strs, bools and None. Anything else is refused when encoding, with where it sits.

Layout::

    MAGIC (8 bytes) | header length (4 bytes, little-endian) | header (UTF-8 JSON)
    | zero padding to a multiple of 64 | data (each tensor at a 64-byte aligned offset)

The header is ``{"tree": NODE, "tensors": [[dtype, shape, offset, nbytes], ...]}``, offsets
relative to the start of the data. A NODE is ``["T", i]`` (tensor ``i``), ``["L", [NODE, ...]]``
(a list), ``["U", [NODE, ...]]`` (a tuple), ``["D", [[key, NODE], ...]]`` (a dict) or
``["V", value]`` (a plain value). Named tuples come back as tuples.

`decode` trusts nothing: it checks the magic, the header's length, its JSON, every node's shape
and nesting depth (at most `MAX_DEPTH`), each dtype against `DTYPES`, each shape (at most
`MAX_DIMS` non-negative ints) against the tensor's byte length, and each tensor's bytes against
the data it was given; it allocates no more than the bytes it was given. Whatever is wrong, it
raises `TensorFormatError` saying what; it never raises anything else and never runs code.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import torch

MAGIC = b"KFTENS01"
LENGTH = struct.Struct("<I")
ALIGNMENT = 64
MAX_HEADER_BYTES = 16 << 20
MAX_DEPTH = 32
MAX_DIMS = 16
MAX_DIM = 1 << 40

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.float16, torch.bfloat16, torch.float32, torch.float64,
        torch.complex64, torch.complex128,
    )
}  # fmt: skip
"""The dtypes this format carries, by name."""

PLAIN = (int, float, str, bool, type(None))


class TensorFormatError(ValueError):
    """Bytes that are not a well-formed encoding; the text says what is wrong."""


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat uint8 tensor (a view where it is contiguous already)."""
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8)


def encode(value: Any, what: str = "batch") -> bytearray:
    """``value`` in this format. Raises `TypeError` naming the first value it cannot carry, by
    its place in ``what`` (``batch[0]['path']``)."""
    tensors: list[list[Any]] = []
    chunks: list[tuple[int, torch.Tensor]] = []
    end = 0

    def node(item: Any, where: str) -> list[Any]:
        nonlocal end
        if isinstance(item, torch.Tensor):
            name = str(item.dtype).removeprefix("torch.")
            if (
                item.layout != torch.strided
                or item.device.type != "cpu"
                or item.is_quantized
                or name not in DTYPES
            ):
                raise TypeError(
                    f"{where}: a {item.layout} {item.dtype} tensor on {item.device} cannot be "
                    f"shared; only dense CPU tensors of {', '.join(DTYPES)}"
                )
            data = _as_bytes(item)
            tensors.append([name, list(item.shape), end, data.numel()])
            chunks.append((end, data))
            end += _aligned(data.numel())
            return ["T", len(tensors) - 1]
        if isinstance(item, PLAIN):
            if isinstance(item, float) and not math.isfinite(item):
                return ["F", repr(item)]
            return ["V", item]
        if isinstance(item, list):
            return ["L", [node(x, f"{where}[{i}]") for i, x in enumerate(item)]]
        if isinstance(item, tuple):
            return ["U", [node(x, f"{where}[{i}]") for i, x in enumerate(item)]]
        if isinstance(item, dict):
            pairs = []
            for key, x in item.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise TypeError(f"{where}: a dict key {key!r} ({type(key).__name__}) cannot be "
                                    "shared; only str and int keys")  # fmt: skip
                pairs.append([key, node(x, f"{where}[{key!r}]")])
            return ["D", pairs]
        raise TypeError(f"{where}: a {type(item).__name__} cannot be shared; only tensors, lists, "
                        "tuples, dicts, ints, floats, strs, bools and None")  # fmt: skip

    tree = node(value, what)
    header = json.dumps({"tree": tree, "tensors": tensors}, allow_nan=False).encode()
    start = _aligned(len(MAGIC) + LENGTH.size + len(header))
    out = bytearray(start + end)
    out[: len(MAGIC)] = MAGIC
    LENGTH.pack_into(out, len(MAGIC), len(header))
    out[len(MAGIC) + LENGTH.size : len(MAGIC) + LENGTH.size + len(header)] = header
    for offset, data in chunks:
        if data.numel():
            out[start + offset : start + offset + data.numel()] = data.numpy().data
    return out


def decode(buffer: bytes | bytearray | memoryview) -> Any:
    """The value `encode` made, with new tensors the caller owns. Raises `TensorFormatError`."""
    view = memoryview(buffer).cast("B")
    prefix = len(MAGIC) + LENGTH.size
    if len(view) < prefix or bytes(view[: len(MAGIC)]) != MAGIC:
        raise TensorFormatError(f"not a shared batch: it does not start with {MAGIC!r}")
    (length,) = LENGTH.unpack_from(view, len(MAGIC))
    if length > MAX_HEADER_BYTES or prefix + length > len(view):
        raise TensorFormatError(
            f"header of {length} bytes does not fit in {len(view) - prefix} bytes "
            f"(at most {MAX_HEADER_BYTES})"
        )
    try:
        header = json.loads(bytes(view[prefix : prefix + length]).decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError too
        raise TensorFormatError(f"header is not JSON: {error}") from None
    if not isinstance(header, dict) or set(header) != {"tree", "tensors"}:
        raise TensorFormatError("header must be an object with exactly 'tree' and 'tensors'")
    specs = header["tensors"]
    if not isinstance(specs, list):
        raise TensorFormatError("header's 'tensors' must be a list")
    data = view[_aligned(prefix + length) :] if _aligned(prefix + length) <= len(view) else view[:0]
    tensors = [_tensor(spec, i, data) for i, spec in enumerate(specs)]
    return _build(header["tree"], tensors, 0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(spec: Any, i: int, data: memoryview) -> torch.Tensor:
    if not (isinstance(spec, list) and len(spec) == 4):
        raise TensorFormatError(f"tensor {i}: expected [dtype, shape, offset, nbytes]")
    name, shape, offset, nbytes = spec
    if not isinstance(name, str) or name not in DTYPES:
        raise TensorFormatError(f"tensor {i}: dtype {name!r} is not one of {', '.join(DTYPES)}")
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(_is_int(n) and 0 <= n <= MAX_DIM for n in shape)
    ):
        raise TensorFormatError(f"tensor {i}: shape {shape!r} is not a list of at most "
                                f"{MAX_DIMS} ints from 0 to {MAX_DIM}")  # fmt: skip
    if not (_is_int(offset) and _is_int(nbytes) and offset >= 0 and nbytes >= 0):
        raise TensorFormatError(f"tensor {i}: offset {offset!r} and nbytes {nbytes!r} must be "
                                "non-negative ints")  # fmt: skip
    dtype = DTYPES[name]
    expected = math.prod(shape) * dtype.itemsize
    if expected != nbytes:
        raise TensorFormatError(f"tensor {i}: shape {shape} of {name} is {expected} bytes, "
                                f"not {nbytes}")  # fmt: skip
    if offset % ALIGNMENT or offset + nbytes > len(data):
        raise TensorFormatError(
            f"tensor {i}: bytes {offset}..{offset + nbytes} are not {ALIGNMENT}-aligned "
            f"within the {len(data)} bytes of data"
        )
    tensor = torch.empty(shape, dtype=dtype)
    if nbytes:
        raw = _as_bytes(tensor)
        raw.numpy().data[:] = data[offset : offset + nbytes]
        if dtype == torch.bool and int(raw.max()) > 1:
            raise TensorFormatError(f"tensor {i}: a bool tensor holds bytes other than 0 and 1")
    return tensor


def _build(node: Any, tensors: list[torch.Tensor], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise TensorFormatError(f"nested deeper than {MAX_DEPTH}")
    if not (isinstance(node, list) and len(node) == 2 and isinstance(node[0], str)):
        raise TensorFormatError(f"a node must be [kind, content], not {_short(node)}")
    kind, content = node
    if kind == "T":
        if not (_is_int(content) and 0 <= content < len(tensors)):
            raise TensorFormatError(f"tensor reference {_short(content)} is not one of the "
                                    f"{len(tensors)} tensors")  # fmt: skip
        return tensors[content]
    if kind == "V":
        if not isinstance(content, PLAIN) or (
            isinstance(content, float) and not math.isfinite(content)
        ):
            raise TensorFormatError(f"a plain value must be a finite number, str, bool or null, "
                                    f"not {_short(content)}")  # fmt: skip
        return content
    if kind == "F":
        if content not in ("nan", "inf", "-inf"):
            raise TensorFormatError(f"a special float must be 'nan', 'inf' or '-inf', "
                                    f"not {_short(content)}")  # fmt: skip
        return float(content)
    if kind in ("L", "U"):
        if not isinstance(content, list):
            raise TensorFormatError(f"a {'list' if kind == 'L' else 'tuple'} node needs a list")
        items = [_build(x, tensors, depth + 1) for x in content]
        return items if kind == "L" else tuple(items)
    if kind == "D":
        if not isinstance(content, list):
            raise TensorFormatError("a dict node needs a list of [key, node] pairs")
        result = {}
        for pair in content:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise TensorFormatError(f"a dict entry must be [key, node], not {_short(pair)}")
            key = pair[0]
            if not (isinstance(key, str) or _is_int(key)):
                raise TensorFormatError(f"a dict key must be a str or int, not {_short(key)}")
            result[key] = _build(pair[1], tensors, depth + 1)
        return result
    raise TensorFormatError(f"unknown node kind {_short(kind)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
