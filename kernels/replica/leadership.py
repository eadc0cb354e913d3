"""The replica that runs a kernel's cells leads its Raft group.

Both of a cell's commits sit on its critical path: the LEAD before it runs and the state delta
before its reply. An executor that is a follower forwards each append to the leader and learns
of the commit from the leader's next message; measured here, that doubled each commit against
an executor that leads (docs/performance.md). Raft's election picks the leader and the gateway's
policy picks the executor, independently, so two times in three they differed.

`LeadershipSeeker.after_cell` is called by the executor once a cell's reply is out: if it does
not lead its group, it asks the leader to hand the leadership over (`KernelLog.take_leadership`),
in the background. The next cells it runs then commit as the leader's. A refusal (its log was
not complete yet, or an election was under way) is retried after a later cell, at most once
every `RETRY_S` seconds, so two replicas that take turns at executing cannot keep the group in
elections. Nothing committed depends on who leads: this only moves where appends start.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernelfleet.raft import KernelLog

log = logging.getLogger("kernelfleet.kernels.replica.leadership")

RETRY_S = 2.0
"""Seconds between two requests for the leadership from the same replica."""


class LeadershipSeeker:
    """Asks for its group's leadership after the cells its replica ran (see the module)."""

    def __init__(self, raft: KernelLog, retry_s: float = RETRY_S) -> None:
        self._raft = raft
        self._retry_s = retry_s
        self._next_ask = 0.0
        self._asking: asyncio.Task[bool] | None = None

    @property
    def asking(self) -> asyncio.Task[bool] | None:
        """The request in flight, if any."""
        return self._asking if self._asking is not None and not self._asking.done() else None

    def after_cell(self) -> None:
        """This replica ran a cell: ask for the leadership unless it leads, a request is in
        flight, or the last one was under `RETRY_S` ago. Returns at once."""
        if self._raft.is_leader or self.asking is not None:
            return
        now = time.monotonic()
        if now < self._next_ask:
            return
        self._next_ask = now + self._retry_s
        self._asking = asyncio.ensure_future(self._ask())

    async def _ask(self) -> bool:
        try:
            return await self._raft.take_leadership()
        except Exception:
            log.exception("asking for the raft leadership failed")
            return False
