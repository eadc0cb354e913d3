"""Waiting with a deadline instead of a sleep: poll a condition, fail the test when time is up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something truthy, and return that; fail the test
    after `timeout` s, naming `what` it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


async def wait_until(
    predicate: Callable[[], Any], within: float, what: str, interval: float = 0.05
) -> Any:
    """`wait_for` inside an event loop: `predicate` may be sync or async, and the loop runs
    while it waits."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:.1f} s waiting for {what}")
        await asyncio.sleep(interval)
