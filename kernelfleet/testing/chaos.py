"""The chaos soak's workload and its verdict: kernels that run counting cells while faults hit
the fleet, and what every cell's fate was (``benchmarks/chaos.py``, the short soak in
``tests/gateway/test_chaos.py``).

Each kernel holds two lists, ``L`` (the effects, ``[0]`` at first) and ``RUNS`` (every run of a
cell that reached the kernel's replicated state). Cell n is::

    RUNS.append(n)
    assert L[-1] == prev, ...   # prev: what the client believes L[-1] is
    L.append(n)

A `KernelDriver` sends them one after another over the gateway's websocket. A cell whose reply
is ``ok`` moves ``prev`` to n. Any other fate (an error reply, the websocket closing, no reply
within the cell timeout) is followed by a probe cell, sent until one succeeds, that reads ``L``:
it tells whether the failed cell's effect happened after all and what ``prev`` is now. The
probe's own failures are retried on a fresh websocket until `Workload.lost_after` seconds pass;
then the kernel is counted lost.

At the end (`verify`), each kernel's ``L`` and ``RUNS`` are read through the gateway and from
every live replica directly (past the gateway, `kernelfleet.testing.replicas.execute_on`), and
held against the client's records:

- **ran twice**: a number more than once in ``RUNS`` or ``L``;
- **lost silently**: a cell answered ``ok`` whose number is not in ``L``;
- **failed with effect**: a cell answered with an error whose number is in ``L`` (its error was
  not the truth); a cell that got no reply at all may go either way (``no reply`` then ``ran``
  or ``not run``) and breaks nothing;
- **replicas differ**: a live replica whose lists differ from the gateway's answer;
- **check failures** (seen while running, so counted even for a kernel lost later): a cell
  whose ``assert L[-1] == prev`` failed, i.e. the effect before it was not what the client had
  been told;
- **lost kernel**: no cell ran through the gateway for `Workload.lost_after` s, or the final
  read failed.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tornado.httpclient import HTTPClientError
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from kernelfleet.testing.fleet import Fleet
from kernelfleet.testing.replicas import execute_on
from kernelfleet.testing.websocket import KernelWebsocket

log = logging.getLogger("kernelfleet.testing.chaos")

LINK_ERRORS = (OSError, TimeoutError, WebSocketClosedError, StreamClosedError, HTTPClientError)
"""What talking to the gateway raises while it or the network is down."""

SETUP = "L = [0]\nRUNS = []"
READ = "import json as _json\nprint(_json.dumps({'L': L, 'RUNS': RUNS}))"
LIVE_REPLICA_STATES = frozenset({"ready", "executing"})


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%H:%M:%S.%f")[:-3]


def cell_code(n: int, prev: int) -> str:
    """Cell `n`: record the run, check the previous effect, append its own."""
    return (
        f"RUNS.append({n})\n"
        f"assert L[-1] == {prev}, f'cell {n}: expected {prev} last, found {{L[-3:]}}'\n"
        f"L.append({n})"
    )


def probe_code(n: int) -> str:
    """Reads what cell `n` left: the last effect and whether `n` is among the effects."""
    return f"print(L[-1], {n} in L)"


class Outcome(enum.Enum):
    """What the client heard back for a cell."""

    OK = "ok"
    ERROR = "error"  # an error reply
    NO_REPLY = "no reply"  # the websocket closed or the cell timed out


@dataclass
class CellRecord:
    n: int
    sent: float
    """`time.time()` when sent (wall clock: faults are stamped with it too)."""
    outcome: Outcome = Outcome.NO_REPLY
    done: float = 0.0
    error: str = ""
    """``ename`` of an error reply, or the exception that ended the wait."""
    applied: bool | None = None
    """What the probe after a failure found (None: not probed: it was ``ok``)."""


@dataclass
class Workload:
    """How the drivers behave."""

    cell_timeout: float = 60.0
    """Seconds a cell may take before the client gives up on its reply."""
    lost_after: float = 180.0
    """Seconds without any successful cell or probe after which a kernel counts as lost."""
    pause: float = 0.0
    """Seconds between two cells of a kernel."""


@dataclass
class KernelDriver:
    """One kernel's client loop; `cells` holds the record of every cell sent."""

    fleet: Fleet
    kernel_id: str
    workload: Workload
    cells: list[CellRecord] = field(default_factory=list)
    prev: int = 0
    lost: str = ""
    """Why the kernel counts as lost, once it does."""
    anomalies: list[str] = field(default_factory=list)
    """What the run saw that breaks the invariant (a failed check, a probe's surprise)."""
    client: KernelWebsocket | None = None
    reconnects: int = 0
    check_failures: int = 0
    """Cells whose check found another last effect than the client was told: an ``ok`` cell
    whose effect the next cell did not see, or a failed one whose effect it did."""

    async def _client(self) -> KernelWebsocket:
        if self.client is None:
            self.client = await asyncio.wait_for(self.fleet.connect(self.kernel_id), 15)
        return self.client

    def _drop_client(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
            self.reconnects += 1

    async def _execute(self, code: str, timeout: float) -> dict[str, Any]:
        """Run `code`; the reply content (``stdout`` added). `LINK_ERRORS` drop the socket."""
        try:
            client = await self._client()
            result = await client.execute(code, timeout=timeout)
            client.unclaimed.clear()  # late messages of cells given up on
        except LINK_ERRORS:
            self._drop_client()
            raise
        return {**result.reply, "stdout": result.stdout}

    async def setup(self) -> None:
        reply = await self._execute(SETUP, self.workload.cell_timeout)
        if reply["status"] != "ok":
            raise RuntimeError(f"kernel {self.kernel_id}: the setup cell failed: {reply}")

    async def run(self, stop: asyncio.Event) -> None:
        """Send cells until `stop` is set or the kernel is lost."""
        n = 0
        while not stop.is_set() and not self.lost:
            n += 1
            record = CellRecord(n, time.time())
            self.cells.append(record)
            try:
                reply = await self._execute(cell_code(n, self.prev), self.workload.cell_timeout)
            except LINK_ERRORS as e:
                record.error = type(e).__name__
            else:
                record.outcome = (
                    Outcome(reply["status"]) if reply["status"] == "ok" else (Outcome.ERROR)
                )
                record.error = "" if record.outcome is Outcome.OK else str(reply.get("ename"))
                if record.error == "AssertionError":
                    self.check_failures += 1
                    self.anomalies.append(
                        f"cell {n} (sent {_clock(record.sent)} UTC): its check failed: "
                        f"{reply.get('evalue')}"
                    )
            record.done = time.time()
            if record.outcome is Outcome.OK:
                self.prev = n
            else:
                await self._settle(record)
            if self.workload.pause:
                await asyncio.sleep(self.workload.pause)

    async def _settle(self, record: CellRecord) -> None:
        """Probe until the kernel answers: did `record`'s cell take effect, and what is last."""
        deadline = time.monotonic() + self.workload.lost_after
        last_error = record.error
        while time.monotonic() < deadline:
            try:
                reply = await self._execute(probe_code(record.n), self.workload.cell_timeout)
            except LINK_ERRORS as e:
                last_error = f"probe: {type(e).__name__}"
            else:
                if reply["status"] == "ok":
                    last, found = reply["stdout"].split()
                    record.applied = found == "True"
                    if int(last) not in (self.prev, record.n):
                        expected = f"{self.prev} or {record.n}"
                        self.anomalies.append(f"cell {record.n}: L ends {last}, not {expected}")
                    self.prev = int(last)
                    return
                last_error = f"probe: {reply.get('ename')}: {reply.get('evalue')}"
            await asyncio.sleep(0.5)
        self.lost = f"no cell ran for {self.workload.lost_after:.0f} s (last: {last_error})"
        log.warning("kernel %s lost: %s", self.kernel_id, self.lost)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


# ---- the verdict ----------------------------------------------------------------------------


def _parse_lists(stdout: str) -> dict[str, list[int]]:
    lists: dict[str, list[int]] = json.loads(stdout.strip().splitlines()[-1])
    return lists


async def read_lists(driver: KernelDriver, within: float = 90.0) -> dict[str, list[int]] | None:
    """The kernel's ``L`` and ``RUNS`` through the gateway (retried), or None if it never ran."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            reply = await driver._execute(READ, 60)
        except LINK_ERRORS:
            await asyncio.sleep(1)
            continue
        if reply["status"] == "ok":
            return _parse_lists(reply["stdout"])
        await asyncio.sleep(1)
    return None


async def read_replicas(fleet: Fleet, kernel_id: str) -> dict[str, dict[str, list[int]] | str]:
    """``{replica id: its L and RUNS}`` for each live replica, read past the gateway; a string
    for a replica that could not be read (why)."""
    status, model = await asyncio.to_thread(fleet.request, "GET", f"/api/fleet/kernels/{kernel_id}")
    if status != 200:
        return {}
    found: dict[str, dict[str, list[int]] | str] = {}
    for replica in model["replicas"]:
        if replica["state"] not in LIVE_REPLICA_STATES:
            continue
        try:
            content, output = await execute_on(fleet, replica, READ, timeout=60)
        except Exception as e:  # a replica that cannot be read is reported, not fatal here
            found[replica["id"]] = f"{type(e).__name__}: {e}"
            continue
        if content["status"] != "ok":
            found[replica["id"]] = f"{content.get('ename')}: {content.get('evalue')}"
        else:
            found[replica["id"]] = _parse_lists(output)
    return found


@dataclass
class KernelVerdict:
    kernel_id: str
    lost: str = ""
    twice: list[int] = field(default_factory=list)
    lost_silently: list[int] = field(default_factory=list)
    failed_with_effect: list[int] = field(default_factory=list)
    replicas_differ: dict[str, str] = field(default_factory=dict)
    replicas_checked: int = 0
    anomalies: list[str] = field(default_factory=list)
    replicas: dict[str, str] = field(default_factory=dict)
    """``{replica id: "host state"}`` as the admin API listed them at the end."""

    def model(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel_id,
            "lost": self.lost or None,
            "twice": self.twice,
            "lost_silently": self.lost_silently,
            "failed_with_effect": self.failed_with_effect,
            "replicas_differ": self.replicas_differ,
            "replicas_checked": self.replicas_checked,
            "anomalies": self.anomalies[:20],
            "replicas": self.replicas,
        }


def judge(
    driver: KernelDriver,
    lists: dict[str, list[int]] | None,
    replicas: dict[str, dict[str, list[int]] | str],
) -> KernelVerdict:
    """Hold the kernel's final lists (`lists`, through the gateway; `replicas`, each replica's)
    against the driver's records."""
    verdict = KernelVerdict(driver.kernel_id, lost=driver.lost, anomalies=list(driver.anomalies))
    if lists is None:
        verdict.lost = verdict.lost or "its lists could not be read through the gateway"
        return verdict
    effects, runs = lists["L"][1:], Counter(lists["RUNS"])
    in_effects = Counter(effects)
    verdict.twice = sorted(
        n for n in set(runs) | set(in_effects) if max(runs[n], in_effects[n]) > 1
    )
    for record in driver.cells:
        if record.outcome is Outcome.OK and not in_effects[record.n]:
            verdict.lost_silently.append(record.n)
        elif record.outcome is Outcome.ERROR and in_effects[record.n]:
            verdict.failed_with_effect.append(record.n)
            verdict.anomalies.append(
                f"cell {record.n}: sent {_clock(record.sent)} UTC, answered {record.error}, "
                "but it took effect"
            )
    for replica_id, seen in replicas.items():
        verdict.replicas_checked += 1
        if isinstance(seen, str):
            verdict.replicas_differ[replica_id] = f"unreadable: {seen}"
        elif seen != lists:
            verdict.replicas_differ[replica_id] = (
                f"{len(seen['L'])} effects, {len(seen['RUNS'])} runs (gateway: "
                f"{len(lists['L'])}, {len(lists['RUNS'])})"
            )
    return verdict
