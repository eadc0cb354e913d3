"""Byte sizes as people write them: ``"8GB"``, ``"512MiB"``, ``"1e9"``, ``"4096"``."""

from __future__ import annotations

import math
import re

from kernelfleet.errors import InvalidRequest

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`text` in bytes: a number (``"1e9"``, ``"4096"``) with an optional unit, decimal
    (``KB MB GB TB``, powers of 1000) or binary (``KiB MiB GiB TiB``, powers of 1024), any
    case. Raises `InvalidRequest` for anything else, for zero and for a fraction of a byte."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise InvalidRequest(f"{text!r} is not a size: write e.g. 8GB, 512MiB or 1e9")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise InvalidRequest(f"{text!r} is not a whole number of bytes from 1")
    return int(value)


def format_size(size: float) -> str:
    """`size` bytes for people: ``"8.00 GB (8000000000 bytes)"``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.2f} {unit} ({int(size)} bytes)"
    return f"{int(size)} bytes"
