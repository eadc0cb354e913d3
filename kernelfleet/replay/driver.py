"""Runs a trace slice against a live gateway: one asyncio task per session, one kernel each.

Everything measured is put on the trace's clock (wall seconds since the replay's origin times
the time scale), so the figures sit in the same units as the simulator's: GPU-hours of trace
time and start delays in trace seconds. Start delays are also kept in wall seconds, since the
gateway's own overheads do not shrink with the time scale.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.protocol import gpu_request
from kernelfleet.replay.client import GatewayClient, KernelChannel, ReplayError
from kernelfleet.replay.counters import AutoscalerCounts
from kernelfleet.replay.meter import FleetMeter
from kernelfleet.replay.plan import ReplayTiming, SessionPlan, cell_code, plan_sessions
from kernelfleet.scheduler.simulator.metrics import Gauge, PolicyResult, percentile
from kernelfleet.scheduler.trace import Trace

log = logging.getLogger("kernelfleet.replay")


@dataclass
class ReplayResult:
    """The live run. ``result`` holds what `PolicyResult` holds for a simulation:
    ``gpu_hours_committed`` is the gateway's ledger, as polled; ``gpu_hours_busy`` the GPUs of
    running cells from the replay's own cell timings (``gpu_hours_committed_by_cells``)."""

    result: PolicyResult
    time_scale: float
    wall_delays_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "line N: why", one per failed event
    failed_polls: int = 0
    late_for_kernel: int = 0  # cells due before their kernel had started
    autoscaler: AutoscalerCounts | None = None  # from /metrics; None if it could not be read

    def as_json(self) -> dict[str, Any]:
        """The simulator's fields, plus the live-only ones (named so they cannot be confused)."""
        ordered = sorted(self.wall_delays_s)
        return {
            **self.result.as_json(),
            "gpu_hours_committed_by_cells": round(self.result.gpu_hours_busy, 3),
            "start_delay_wall_s": {f"p{q}": round(percentile(ordered, q), 4) for q in (50, 95, 99)},
            "sessions": self.result.sessions,
            "failed_events": len(self.failures),
            "cells_late_for_kernel": self.late_for_kernel,
            "gateway_autoscaler": None if self.autoscaler is None else self.autoscaler.as_json(),
        }


@dataclass
class _Kernel:
    id: str
    channel: KernelChannel


class Replay:
    """One replay of `trace` on the gateway behind `client`. `run` once."""

    def __init__(
        self,
        client: GatewayClient,
        trace: Trace,
        timing: ReplayTiming,
        *,
        policy_name: str = "live",
        poll_interval_s: float = 0.25,
        cell_timeout_s: float = 120.0,
        kernel_name: str = "",
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.client = client
        self.trace = trace
        self.timing = timing
        self.plans = plan_sessions(trace, timing)
        self.policy_name = policy_name
        self.poll_interval_s = poll_interval_s
        self.cell_timeout_s = cell_timeout_s
        self.kernel_name = kernel_name
        self.progress = progress
        self.origin = 0.0
        self._cells: list[tuple[float, float, int]] = []  # (start, end, gpus), trace seconds
        self._delays: list[tuple[float, float]] = []  # (trace seconds, wall seconds)
        self._failures: list[str] = []
        self._late_for_kernel = 0
        self._done = 0
        self.meter: FleetMeter | None = None

    def clock(self) -> float:
        """Trace seconds since the origin (negative before it)."""
        return (time.monotonic() - self.origin) * self.timing.time_scale

    async def run(self) -> ReplayResult:
        before = await self._counters()
        # kernels of the earliest sessions start `kernel_start_allowance_s` before the origin
        self.origin = time.monotonic() + self.timing.kernel_start_allowance_s + 0.2
        meter = self.meter = FleetMeter(self.client, self.clock, self.poll_interval_s)
        stop = asyncio.Event()
        polling = asyncio.create_task(self._meter_from_origin(meter, stop))
        try:
            await asyncio.gather(*(self._session(plan) for plan in self.plans))
        finally:
            meter.close()
            stop.set()
            await polling
        after = await self._counters()
        result = self._result(meter)
        if before is not None and after is not None:
            result.autoscaler = AutoscalerCounts.between(before, after)
        return result

    async def _counters(self) -> dict[str, float] | None:
        """The gateway's metrics now; None (logged) if they cannot be read."""
        try:
            return await self.client.metrics()
        except ReplayError as error:
            log.warning("reading the gateway's metrics failed: %s", error.message)
            return None

    async def _meter_from_origin(self, meter: FleetMeter, stop: asyncio.Event) -> None:
        await _sleep_until(self.origin)
        await meter.run(stop)

    # ---- one session ---------------------------------------------------------------------

    async def _session(self, plan: SessionPlan) -> None:
        timing = self.timing
        kernel: _Kernel | None = None
        submit = ended = self.origin + plan.first_submit_s
        try:
            for index, cell in enumerate(plan.cells):
                if index:
                    submit = ended + cell.gap_before_s
                if kernel is not None and cell.reclaim_before:
                    await _sleep_until(ended + timing.wall(timing.idle_timeout_s))
                    await self._close(kernel)
                    kernel = None
                if kernel is None:
                    lead = timing.wall(timing.session_lead_s) + timing.kernel_start_allowance_s
                    await _sleep_until(submit - lead)
                    try:
                        kernel = await self._open(plan.gpus)
                    except ReplayError as error:
                        self._fail([c.line for c in plan.cells[index:]], error.message)
                        return
                    if time.monotonic() > submit:
                        # its start delay will include the rest of the kernel's start-up,
                        # which the simulator takes as free (covered by the lead time)
                        self._late_for_kernel += 1
                await _sleep_until(submit)
                metadata = gpu_request(cell.gpus) if cell.gpus != plan.gpus else None
                try:
                    cell_timing = await kernel.channel.execute(
                        cell_code(cell.duration_s), metadata, cell.duration_s + self.cell_timeout_s
                    )
                except ReplayError as error:
                    self._fail([cell.line], error.message)
                    ended = time.monotonic()
                    await self._close(kernel)  # a fresh kernel for the next cell, if any
                    kernel = None
                    continue
                ended = cell_timing.ended
                if cell_timing.status != "ok":
                    self._fail([cell.line], f"the cell's reply was {cell_timing.status!r}")
                    continue
                self._record(cell_timing, min(cell_timing.sent, submit), cell.gpus)
            await _sleep_until(ended + timing.wall(timing.session_linger_s))
        finally:
            self._session_ended()
            if kernel is not None:
                await self._close(kernel)

    def _session_ended(self) -> None:
        """The measured window ends with the last session, as the simulator's clock does (not
        after the last kernel's shutdown call returns)."""
        self._done += 1
        if self._done == len(self.plans) and self.meter is not None:
            self.meter.close()
        if self.progress is not None:
            self.progress(self._done, len(self.plans))

    async def _open(self, gpus: int) -> _Kernel:
        kernel_id = await self.client.start_kernel(gpus, self.kernel_name)
        if self.meter is not None:
            self.meter.kernel_ids.add(kernel_id)
        try:
            channel = await self.client.connect(kernel_id)
        except ReplayError:
            await self._delete(kernel_id)
            raise
        return _Kernel(kernel_id, channel)

    async def _close(self, kernel: _Kernel) -> None:
        kernel.channel.close()
        await self._delete(kernel.id)

    async def _delete(self, kernel_id: str) -> None:
        try:
            await self.client.delete_kernel(kernel_id)
        except ReplayError as error:
            log.warning("could not shut kernel %s down: %s", kernel_id, error.message)

    def _record(self, cell: Any, since: float, gpus: int) -> None:
        scale = self.timing.time_scale
        wall_delay = max(0.0, cell.started - since)
        self._delays.append((wall_delay * scale, wall_delay))
        start = (cell.started - self.origin) * scale
        self._cells.append((start, (cell.ended - self.origin) * scale, gpus))

    def _fail(self, lines: list[int], why: str) -> None:
        for line in lines:
            self._failures.append(f"line {line}: {why}")
        log.warning("%d event(s) failed from line %d: %s", len(lines), lines[0], why)

    # ---- the result ----------------------------------------------------------------------

    def _result(self, meter: FleetMeter) -> ReplayResult:
        result = PolicyResult(self.policy_name, sessions=len(self.plans))
        result.events = len(self._cells)
        result.delays_s = [trace_s for trace_s, _ in self._delays]
        result.rejected_events = len(self._failures)
        result.migrations = meter.migrations
        result.scale_outs, result.scale_ins = meter.scale_outs, meter.scale_ins
        result.peak_hosts = meter.peak_hosts
        result.end_s = meter.provisioned.history[-1][0]
        result.gpu_hours_provisioned = meter.provisioned.area / 3600
        result.gpu_hours_committed = meter.committed.area / 3600
        busy = busy_gauge(self._cells)
        result.gpu_hours_busy = busy.area / 3600
        result.provisioned_history = meter.provisioned.history
        result.busy_history = busy.history
        return ReplayResult(
            result,
            self.timing.time_scale,
            wall_delays_s=[wall for _, wall in self._delays],
            failures=list(self._failures),
            failed_polls=meter.failed_polls,
            late_for_kernel=self._late_for_kernel,
        )


def busy_gauge(cells: list[tuple[float, float, int]]) -> Gauge:
    """GPUs held by running cells over trace time (from the origin, 0), from (start, end, gpus)
    intervals; ends at the last cell's end."""
    changes = sorted([(s, g) for s, _, g in cells] + [(e, -g) for _, e, g in cells])
    gauge = Gauge(0.0)
    for at, delta in changes:
        gauge.set(at, gauge.value + delta)
    gauge.close(changes[-1][0] if changes else 0.0)
    return gauge


async def _sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
