"""Caches made by these tests get unique names and are dropped afterwards, whatever happens:
no test leaves a shared-memory segment on the host."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet.tools.dataload.cache import SEGMENT_PREFIX, drop_cache


@pytest.fixture
def cache_name() -> Iterator[str]:
    """A fresh cache name, dropped (segment and lock file) after the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    drop_cache(name)
    assert not list(Path("/dev/shm").glob(f"{SEGMENT_PREFIX}{name}*"))
