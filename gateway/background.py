"""Work the gateway starts and does not wait for (repairs, clean-ups)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Runs coroutines on their own, keeping a reference to each until it ends (the event
    loop keeps only weak ones, so an unreferenced task may vanish mid-way)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def run(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
