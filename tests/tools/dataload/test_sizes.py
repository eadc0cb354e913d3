"""Byte sizes as people write them."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GB", 8 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1e9", 10**9),
        ("4096", 4096),
        ("1.5 kb", 1500),
        ("2gib", 2 * 2**30),
        ("1TB", 10**12),
        ("100B", 100),
    ],
)
def test_sizes_parse(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "8 XB", "-1GB", "0", "0.5", "1e400", "eight"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_size(text)


def test_sizes_format_with_the_exact_bytes() -> None:
    assert format_size(8 * 10**9) == "8.00 GB (8000000000 bytes)"
    assert format_size(512 * 2**20) == "536.87 MB (536870912 bytes)"
    assert format_size(12) == "12 bytes"
