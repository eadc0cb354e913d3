"""The tensor-only format: what it carries comes back equal; whatever bytes it is given, decoding
returns a value or raises `TensorFormatError`, nothing else (fuzzed with hypothesis)."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import struct
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernelfleet.tools.dataload.tensor_format import (  # noqa: E402
    DTYPES,
    MAGIC,
    TensorFormatError,
    decode,
    encode,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(
                torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()))
            )
        )
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@st.composite
def tensors(draw: Any) -> Any:
    dtype = draw(st.sampled_from(sorted(DTYPES.values(), key=str)))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    tensor = torch.zeros(shape, dtype=dtype)
    if tensor.numel():
        flat = draw(st.lists(st.integers(0, 1 if dtype == torch.bool else 100),
                             min_size=tensor.numel(), max_size=tensor.numel()))  # fmt: skip
        tensor = torch.tensor(flat).to(dtype).reshape(shape)
    return tensor


plain = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8)
)
batches = st.recursive(
    st.one_of(plain, tensors()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-5, 5)), inner, max_size=4),
    ),
    max_leaves=12,
)


@FUZZ
@given(batches)
def test_what_it_carries_comes_back_equal(batch: Any) -> None:
    assert same(batch, decode(encode(batch)))


def test_a_collated_batch_comes_back_with_its_tensors_owned() -> None:
    images, labels = torch.randn(4, 3, 8, 8), torch.arange(4)
    blob = encode((images, labels, {"names": ["a", "b"]}))
    back = decode(blob)
    blob[:] = bytes(len(blob))  # the decoded tensors do not share the buffer
    assert torch.equal(back[0], images)
    assert torch.equal(back[1], labels)
    assert back[2] == {"names": ["a", "b"]}


def test_a_named_tuple_comes_back_as_a_tuple() -> None:
    pair_type = collections.namedtuple("pair_type", "x y")
    pair = pair_type(torch.ones(2), 3)
    back = decode(encode(pair))
    assert type(back) is tuple
    assert torch.equal(back[0], torch.ones(2))
    assert back[1] == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([object()], "batch[0]: a object cannot be shared"),
        ({"k": {1.5: 2}}, "batch['k']: a dict key 1.5 (float) cannot be shared"),
        (torch.ones(2).to_sparse(), "sparse"),
        ((torch.ones(1, dtype=torch.uint16),) if hasattr(torch, "uint16") else [set()], "cannot"),
    ],
)
def test_what_it_cannot_carry_is_refused_with_where(value: Any, message: str) -> None:
    with pytest.raises(TypeError) as refused:
        encode(value)
    assert message in str(refused.value)


def header(obj: Any, data: bytes = b"") -> bytes:
    body = json.dumps(obj).encode()
    start = -(-(len(MAGIC) + 4 + len(body)) // 64) * 64
    blob = MAGIC + struct.pack("<I", len(body)) + body
    return blob + bytes(start - len(blob)) + data


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x80\x04pickle", "does not start with"),
        (MAGIC + b"\xff\xff\xff\x7f", "header of 2147483647 bytes does not fit"),
        (MAGIC + b"\x03\x00\x00\x00\xff\xfe\x00", "header is not JSON"),
        (header([1]), "exactly 'tree' and 'tensors'"),
        (header({"tree": ["T", 0], "tensors": [["object", [1], 0, 8]]}), "dtype 'object' is not"),
        (header({"tree": ["T", 0], "tensors": [["float32", [2, 2], 0, 8]]}), "is 16 bytes, not 8"),
        (header({"tree": ["T", 0], "tensors": [["int64", [-1], 0, 8]]}), "shape [-1]"),
        (header({"tree": ["T", 0], "tensors": [["int64", [2**20], 0, 2**23]]}), "within the 0"),
        (header({"tree": ["T", 0], "tensors": [["uint8", [1], 1, 1]]}, bytes(64)), "aligned"),
        (header({"tree": ["T", 1], "tensors": []}), "reference 1 is not one of the 0"),
        (header({"tree": ["X", 1], "tensors": []}), "unknown node kind 'X'"),
        (header({"tree": ["V", [1]], "tensors": []}), "plain value"),
        (header({"tree": ["D", [[1.5, ["V", 1]]]], "tensors": []}), "dict key must be"),
        (header({"tree": ["T", 0], "tensors": [["bool", [1], 0, 1]]}, b"\x07" + bytes(63)), "bool"),
        (header({"tree": ["V", 1], "tensors": []}), None),
        (header({"tree": json.loads("[" * 30 + "]" * 30), "tensors": []}), "node must be"),
    ],
)
def test_bad_bytes_are_refused_precisely(blob: bytes, message: str | None) -> None:
    if message is None:
        assert decode(blob) == 1
        return
    with pytest.raises(TensorFormatError) as refused:
        decode(blob)
    assert message in str(refused.value)


def test_nesting_is_bounded() -> None:
    tree: Any = ["V", 0]
    for _ in range(100):
        tree = ["L", [tree]]
    with pytest.raises(TensorFormatError, match="nested deeper than 32"):
        decode(header({"tree": tree, "tensors": []}))
    with pytest.raises(TensorFormatError, match="header is not JSON"):  # json's own recursion
        decode(MAGIC + struct.pack("<I", 200_000) + b"[" * 200_000)


def decodes_or_refuses(blob: bytes) -> None:
    with contextlib.suppress(TensorFormatError):
        decode(blob)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_are_refused(blob: bytes) -> None:
    decodes_or_refuses(blob)
    decodes_or_refuses(MAGIC + blob)


@FUZZ
@given(batches, st.data())
def test_garbled_encodings_decode_or_are_refused(batch: Any, data: Any) -> None:
    blob = bytearray(encode(batch))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] = data.draw(st.integers(0, 255))
    decodes_or_refuses(bytes(blob))
    decodes_or_refuses(bytes(blob[: data.draw(st.integers(0, len(blob)))]))


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**65), 2**65),
        st.floats(),
        st.text(max_size=6),
        st.sampled_from(["T", "L", "U", "D", "V", "F", "nan", "float32", "bool"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["tree", "tensors", "x"]), inner, max_size=3),
    ),
    max_leaves=20,
)


@FUZZ
@given(json_values, json_values, st.binary(max_size=256))
def test_random_headers_decode_or_are_refused(tree: Any, specs: Any, data: bytes) -> None:
    decodes_or_refuses(header({"tree": tree, "tensors": specs}, data))
    decodes_or_refuses(header(tree, data))
