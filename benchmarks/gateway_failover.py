"""A replicated gateway's failover: the serving member SIGKILLed under a steady cell stream.

    python benchmarks/gateway_failover.py [--kernels 4] [--failovers 3] [--interval 10]
        [--cell-gap 0.2] [--quick] [--json OUT] [--keep]

Starts a replicated gateway (`kernelfleet.testing.gateway_group.GatewayGroup`: three
``kernelfleet gateway --group-members ...`` members, ``kernelfleet gateway-proxy`` in front,
3 host agents of 1 GPU each, kernels of 3 replicas) and `--kernels` kernels, each driven by a
client of its own through the proxy, as users reach the gateway: a first cell ``n = 0``, then
``n += 1; print(n)`` one at a time, `--cell-gap` s apart. Each cell ends ``ok`` (reply ok),
``error`` (reply not ok) or ``lost`` (the websocket closed, or no reply in 60 s: the proxy
closes its connections to a member that stops serving; the report says whether the websocket
was already closed when the cell was written); after a lost cell the client connects again
(retrying until it can, timed) and goes on.

After `--interval` s of that stream, the serving member is SIGKILLed; the figures are the time
until another member answers ``/api/fleet/serving`` with 200 (polled every 0.05 s) and the
time until every kernel completed a cell sent after the kill. The killed member is then started
again, as its supervisor would, and the stream runs `--interval` s before the next kill
(`--failovers` in all) and after the last.

At the end each kernel's ``n`` is read: it must lie between the ``ok`` cells after the first
and those plus the ``lost`` ones (a lost cell may or may not have run); outside that, a cell
was lost or ran twice (the ``n`` each ``ok`` cell printed is held the same way against the
one before it). ``GET /api/kernels`` must list every kernel, none dead. Prints the
figures (and writes them with `--json`); exits 1 if a kernel was lost or is inconsistent, or a
failover never ended.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketError

from kernelfleet.testing import KernelWebsocket, percentile
from kernelfleet.testing.fleet import Fleet
from kernelfleet.testing.gateway_group import GatewayGroup

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

NAME = "gateway_failover"
CELL = "n += 1; print(n)"
LOST_AFTER_S = 60.0
"""A cell with no reply after that is lost."""
POLL_S = 0.05
"""How often the time to serve again and to answer again are polled."""
RECONNECT_LIMIT_S = 120.0
"""A kernel that cannot be connected to again within that is lost."""
RECOVERY_LIMIT_S = 180.0
"""A failover after which some kernel has not answered within that never ended."""
DELAYED_S = 1.0
"""A cell that took longer (and was not lost) is delayed."""
LOST_ERRORS = (ConnectionError, WebSocketClosedError, StreamClosedError)
"""What waiting for a cell's reply raises when its websocket closes."""
CLOSED_WHEN_SENT = "the websocket was closed when the cell was sent"
CLOSED = "the websocket closed before the reply"
NO_REPLY = f"no reply in {LOST_AFTER_S:.0f} s"


@dataclass
class Cell:
    """One cell of a kernel's stream: sent at `sent` (s since the stream began)."""

    sent: float
    latency: float
    outcome: str
    printed: int | None = None
    """What the cell printed (``ok`` cells): the kernel's ``n`` after it."""
    why: str = ""
    """Why a cell was lost: `CLOSED_WHEN_SENT`, `CLOSED` or `NO_REPLY`."""

    @property
    def done(self) -> float:
        return self.sent + self.latency


class KernelUnreachable(Exception):
    """A kernel that could not be connected to again within `RECONNECT_LIMIT_S`."""


@dataclass
class Driver:
    """One kernel's client: its cells, one at a time through the proxy, and its reconnects."""

    fleet: Fleet
    kernel_id: str
    t0: float
    gap: float
    client: KernelWebsocket | None = None
    cells: list[Cell] = field(default_factory=list)
    reconnects: list[dict[str, float]] = field(default_factory=list)
    unreachable: str | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def connect(self) -> None:
        """Connect through the proxy, retrying until it works (timed when it is a reconnect)."""
        began = self.now()
        while True:
            try:
                self.client = await self.fleet.connect(self.kernel_id)
                break
            except (HTTPClientError, OSError, StreamClosedError, WebSocketError) as e:
                if self.now() - began > RECONNECT_LIMIT_S:
                    raise KernelUnreachable(
                        f"no websocket for {RECONNECT_LIMIT_S:.0f} s: {e}"
                    ) from e
                await asyncio.sleep(0.1)
        self.reconnects.append({"at": began, "took_s": self.now() - began})

    async def cell(self, code: str) -> Cell:
        """Run `code`; a closed websocket or no reply in `LOST_AFTER_S` is a lost cell, after
        which the client connects again."""
        if self.client is None:
            await self.connect()
        assert self.client is not None
        sent = self.now()
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        try:
            msg_id = self.client.send("execute_request", content)
        except WebSocketClosedError:
            result, why = None, CLOSED_WHEN_SENT
        else:
            try:
                result, why = await self.client.collect(msg_id, LOST_AFTER_S), ""
            except TimeoutError:
                result, why = None, NO_REPLY
            except LOST_ERRORS:
                result, why = None, CLOSED
        if result is None:
            cell = Cell(sent, self.now() - sent, "lost", why=why)
            self.client.close()
            self.client = None
        else:
            ok = result.reply["status"] == "ok"
            printed = int(result.stdout) if ok and result.stdout.strip().isdigit() else None
            cell = Cell(sent, self.now() - sent, "ok" if ok else "error", printed)
        return cell

    async def stream(self, stop: asyncio.Event) -> None:
        """``n += 1; print(n)`` until `stop`, `gap` s between cells."""
        try:
            while not stop.is_set():
                self.cells.append(await self.cell(CELL))
                if self.client is None:
                    await self.connect()
                await asyncio.sleep(self.gap)
        except KernelUnreachable as e:
            self.unreachable = str(e)

    def answered_after(self, moment: float) -> float | None:
        """When this kernel first completed an ``ok`` cell sent after `moment`, if it has."""
        return next((c.done for c in self.cells if c.sent > moment and c.outcome == "ok"), None)


async def failover(group: GatewayGroup, drivers: list[Driver], t0: float) -> dict[str, Any]:
    """SIGKILL the serving member, time until another serves and every kernel answered, then
    start the killed one again."""
    old = await asyncio.to_thread(group.serving)
    assert old is not None, "no member serves before the kill"
    killed = time.monotonic() - t0
    await asyncio.to_thread(group.kill_member, old)
    new = None
    while new is None:
        new = await asyncio.to_thread(group.serving, old)
        if new is None:
            if time.monotonic() - t0 - killed > RECOVERY_LIMIT_S:
                break
            await asyncio.sleep(POLL_S)
    serves = time.monotonic() - t0 - killed
    harness.progress(
        NAME, f"member {old} killed at {killed:.1f} s; {new} serves after {serves:.2f} s"
    )
    answered: list[float | None] = []
    while time.monotonic() - t0 - killed < RECOVERY_LIMIT_S:
        answered = [d.answered_after(killed) for d in drivers]
        if all(a is not None for a in answered) or all(d.unreachable for d in drivers):
            break
        await asyncio.sleep(POLL_S)
    ended = all(a is not None for a in answered)
    again = max(a for a in answered if a is not None) - killed if ended else None
    if again is None:
        harness.progress(NAME, f"a kernel did not answer within {RECOVERY_LIMIT_S:.0f} s")
    else:
        harness.progress(NAME, f"every kernel answered {again:.2f} s after the kill")
    restart_began = time.monotonic() - t0
    if ended:
        await asyncio.to_thread(group.restart_member, old)
    restarted = time.monotonic() - t0
    return {
        "killed_member": old,
        "serving_member": new,
        "killed_at_s": killed,
        "serves_again_s": serves if new is not None else None,
        "every_kernel_answered_s": again,
        "each_kernel_answered_s": [None if a is None else a - killed for a in answered],
        "recovered_at_s": killed + again if again is not None else None,
        "restart_window_s": [restart_began, restarted],
        "restart_took_s": restarted - restart_began,
        "serving_after_restart": await asyncio.to_thread(group.serving),
    }


async def measure(group: GatewayGroup, args: argparse.Namespace) -> dict[str, Any]:
    fleet = group.fleet
    kernel_ids = [await asyncio.to_thread(fleet.start_kernel) for _ in range(args.kernels)]
    t0 = time.monotonic()
    drivers = [Driver(fleet, k, t0, args.cell_gap) for k in kernel_ids]
    for driver in drivers:
        first = await driver.cell("n = 0")
        assert first.outcome == "ok", f"the first cell of {driver.kernel_id}: {first}"
        driver.reconnects.clear()  # the first connection is no reconnect
    harness.progress(NAME, f"{args.kernels} kernel(s) streaming cells")
    stop = asyncio.Event()
    streams = [asyncio.create_task(d.stream(stop)) for d in drivers]
    failovers = []
    for round_ in range(args.failovers):
        await asyncio.sleep(args.interval)
        failovers.append(await failover(group, drivers, t0))
        if failovers[-1]["every_kernel_answered_s"] is None:
            harness.progress(NAME, f"failover {round_ + 1} never ended: stopping")
            break
    else:
        await asyncio.sleep(args.interval)
    stop.set()
    await asyncio.gather(*streams)
    ended = time.monotonic() - t0
    finals = []
    for driver in drivers:
        final: Cell | None = None
        for _ in range(3):  # a lost reading is read again
            if driver.unreachable is not None or (final and final.outcome != "lost"):
                break
            try:
                final = await driver.cell("print(n)")
            except KernelUnreachable as e:
                driver.unreachable = str(e)
        finals.append(final)
        if driver.client is not None:
            driver.client.close()
    status, listed = await asyncio.to_thread(fleet.request, "GET", "/api/kernels")
    return {
        "drivers": drivers,
        "finals": finals,
        "failovers": failovers,
        "stream_s": ended,
        "listed": (status, listed),
    }


def latency_figures(cells: list[Cell]) -> dict[str, Any]:
    times = [c.latency * 1000 for c in cells]
    if not times:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "n": len(times),
        "p50_ms": percentile(times, 50),
        "p99_ms": percentile(times, 99),
        "max_ms": max(times),
    }


def overlaps(cell: Cell, windows: list[tuple[float, float]]) -> bool:
    return any(cell.sent <= end and cell.done >= begin for begin, end in windows)


def kernel_verdict(driver: Driver, final: Cell | None) -> dict[str, Any]:
    """``n`` against the cells after the first: ok <= n <= ok + lost, else a cell was lost or
    ran twice. Also where the printed ``n`` of consecutive ok cells jumped by more than the
    lost cells between them explain."""
    stream = driver.cells
    ok = sum(c.outcome == "ok" for c in stream)
    lost = sum(c.outcome == "lost" for c in stream)
    errors = sum(c.outcome == "error" for c in stream)
    n = final.printed if final is not None and final.outcome == "ok" else None
    if n is None:
        verdict = "unknown: n could not be read"
    elif n < ok:
        verdict = f"INCONSISTENT: n = {n} < {ok} ok cells: a cell that answered ok was lost"
    elif n > ok + lost:
        verdict = f"INCONSISTENT: n = {n} > {ok} ok + {lost} lost cells: a cell ran twice"
    else:
        verdict = "consistent"
    jumps = []
    previous, unknown = 0, 0
    for c in stream:
        if c.outcome == "lost":
            unknown += 1
        elif c.outcome == "ok" and c.printed is not None:
            if not previous < c.printed <= previous + 1 + unknown:
                jumps.append({"at_s": c.sent, "from": previous, "to": c.printed, "lost": unknown})
            previous, unknown = c.printed, 0
    return {
        "kernel": driver.kernel_id,
        "n": n,
        "ok": ok,
        "error": errors,
        "lost": lost,
        "lost_that_ran": None if n is None else n - ok,
        "verdict": verdict,
        "unexplained_jumps": jumps,
        "reconnects": len(driver.reconnects),
        "reconnect_max_s": max((r["took_s"] for r in driver.reconnects), default=None),
        "unreachable": driver.unreachable,
    }


def summarize(measured: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    drivers: list[Driver] = measured["drivers"]
    failovers = measured["failovers"]
    cells = [c for d in drivers for c in d.cells]
    by = {o: [c for c in cells if c.outcome == o] for o in ("ok", "error", "lost")}
    windows = [(f["killed_at_s"], f["recovered_at_s"] or measured["stream_s"]) for f in failovers]
    rejoins = [tuple(f["restart_window_s"]) for f in failovers]
    status, listed = measured["listed"]
    states = {k["id"]: k.get("execution_state") for k in listed} if status == 200 else {}
    kernels = [kernel_verdict(d, f) for d, f in zip(drivers, measured["finals"], strict=True)]
    for row in kernels:
        row["listed"] = row["kernel"] in states
        row["execution_state"] = states.get(row["kernel"])
    lost_kernels = [
        k["kernel"]
        for k in kernels
        if not k["listed"] or k["execution_state"] == "dead" or k["unreachable"]
    ]
    for f, (begin, end) in zip(failovers, windows, strict=True):
        f["cells"] = {
            o: sum(c.outcome == o and overlaps(c, [(begin, end)]) for c in cells)
            for o in ("ok", "error", "lost")
        }
        reconnects = [r for d in drivers for r in d.reconnects if begin <= r["at"] <= end]
        f["reconnects"] = len(reconnects)
        f["reconnect_max_s"] = max((r["took_s"] for r in reconnects), default=None)
    return {
        "machine": harness.describe_machine(),
        "parameters": {
            "kernels": args.kernels,
            "failovers": args.failovers,
            "interval_s": args.interval,
            "cell_gap_s": args.cell_gap,
            "quick": args.quick,
        },
        "stream_s": measured["stream_s"],
        "failovers": failovers,
        "cells": {
            "total": len(cells),
            "ok": len(by["ok"]),
            "error": len(by["error"]),
            "lost": len(by["lost"]),
            "failed_as_seen": len(by["error"]) + len(by["lost"]),
            "lost_closed_when_sent": sum(c.why == CLOSED_WHEN_SENT for c in by["lost"]),
            "delayed_over_1s": sum(c.latency > DELAYED_S for c in cells if c.outcome != "lost"),
        },
        "latency": {
            "steady": latency_figures(
                [c for c in by["ok"] if not overlaps(c, windows) and not overlaps(c, rejoins)]
            ),
            "across_failovers": latency_figures([c for c in by["ok"] if overlaps(c, windows)]),
            "while_a_member_rejoins": latency_figures(
                [c for c in by["ok"] if overlaps(c, rejoins) and not overlaps(c, windows)]
            ),
        },
        "not_ok_cells": [
            {
                "kernel": i,
                "sent_s": c.sent,
                "latency_s": c.latency,
                "outcome": c.outcome,
                "why": c.why,
            }
            for i, d in enumerate(drivers)
            for c in d.cells
            if c.outcome != "ok"
        ],
        "kernels_listed": {"status": status, "states": states},
        "kernels": kernels,
        "kernels_lost": lost_kernels,
        "failover_never_ended": any(f["every_kernel_answered_s"] is None for f in failovers),
    }


def run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    root.chmod(0o711)  # kernels run as users of their own (docs/security.md) and must reach it
    harness.progress(NAME, f"gateway group and logs in {root / 'group'}")
    group = GatewayGroup.start(root / "group", hosts=3, gpus=1)
    try:
        measured = asyncio.run(measure(group, args))
    finally:
        group.stop()
    return summarize(measured, args)


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(report: dict[str, Any]) -> str:
    m, p, c = report["machine"], report["parameters"], report["cells"]
    lines = [
        f"{m['cpus']} CPUs, Python {m['python']}, ipykernel {m['ipykernel']}; {p['kernels']} "
        f"kernel(s), a cell every {p['cell_gap_s']} s after the last, {p['failovers']} "
        f"failover(s) {p['interval_s']} s apart; stream {report['stream_s']:.0f} s",
        "",
        f"{'failover':<10}{'killed':>8}{'serves':>8}{'serves again':>14}"
        f"{'every kernel again':>20}{'ok':>6}{'error':>7}{'lost':>6}{'reconnect max':>15}"
        f"{'rejoin':>10}",
    ]
    for i, f in enumerate(report["failovers"], 1):
        lines.append(
            f"{i:<10}{f['killed_member']:>8}{f['serving_member']!s:>8}"
            f"{seconds(f['serves_again_s']):>14}{seconds(f['every_kernel_answered_s']):>20}"
            f"{f['cells']['ok']:>6}{f['cells']['error']:>7}{f['cells']['lost']:>6}"
            f"{seconds(f['reconnect_max_s']) if f['reconnects'] else '-':>15}"
            f"{seconds(f['restart_took_s']):>10}"
        )
    lines += [
        "",
        f"cells: {c['total']} total, {c['ok']} ok, {c['error']} error, {c['lost']} lost "
        f"({c['failed_as_seen']} failed as the user sees it; {c['lost_closed_when_sent']} lost "
        f"cells were sent on a websocket already closed); {c['delayed_over_1s']} delayed over "
        f"1 s (not lost)",
        f"{'ok cells, latency':<34}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}",
    ]
    for label, key in (
        ("steady state", "steady"),
        ("across failovers", "across_failovers"),
        ("while the killed member rejoins", "while_a_member_rejoins"),
    ):
        f = report["latency"][key]
        lines.append(
            f"{label:<34}{f['n']:>6}{milliseconds(f['p50_ms']):>10}"
            f"{milliseconds(f['p99_ms']):>10}{milliseconds(f['max_ms']):>10}"
        )
    for bad in report["not_ok_cells"]:
        lines.append(
            f"  kernel {bad['kernel'] + 1}: cell sent at {bad['sent_s']:.2f} s {bad['outcome']} "
            f"after {bad['latency_s']:.2f} s" + (f": {bad['why']}" if bad["why"] else "")
        )
    lines += ["", f"{'kernel':<38}{'n':>6}{'ok':>6}{'lost':>6}{'error':>7}  verdict"]
    for k in report["kernels"]:
        state = "" if k["listed"] else "; NOT LISTED"
        if k["execution_state"] == "dead":
            state += "; DEAD"
        if k["unexplained_jumps"]:
            state += f"; {len(k['unexplained_jumps'])} unexplained jump(s) in printed n"
        lines.append(
            f"{k['kernel']:<38}{k['n']!s:>6}{k['ok']:>6}{k['lost']:>6}{k['error']:>7}  "
            f"{k['verdict']}{state}"
        )
    lines.append(f"kernels lost: {len(report['kernels_lost'])}")
    if report["failover_never_ended"]:
        lines.append("A FAILOVER NEVER ENDED")
    return "\n".join(lines)


def broken(report: dict[str, Any]) -> bool:
    return bool(
        report["kernels_lost"]
        or report["failover_never_ended"]
        or any(k["verdict"] != "consistent" or k["unexplained_jumps"] for k in report["kernels"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kernels", type=int, default=4)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument(
        "--interval", type=float, default=10, help="seconds of steady stream before each kill"
    )
    parser.add_argument("--cell-gap", type=float, default=0.2, help="seconds between cells")
    parser.add_argument("--quick", action="store_true", help="1 kernel, 1 failover, interval 5 s")
    harness.add_output_arguments(parser, kept="the members', proxy's and agents' logs")
    args = parser.parse_args(argv)
    if args.quick:
        args.kernels, args.failovers, args.interval = 1, 1, 5.0
    reports: list[dict[str, Any]] = []

    def keep(root: Path, args: argparse.Namespace) -> dict[str, Any]:
        reports.append(run(root, args))
        return reports[-1]

    harness.run_benchmark(NAME, args, keep, render)
    return 1 if broken(reports[-1]) else 0


if __name__ == "__main__":
    sys.exit(main())
