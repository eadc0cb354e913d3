"""The event-loop lag probe: a stall of the loop shows as a sample at least as long as the
stall, and a live gateway exports the probe's histogram and its heartbeat handling times."""

from __future__ import annotations

import asyncio
import time

import pytest

from kernelfleet.gateway.loop_lag import probe_loop_lag
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.testing import Fleet, wait_for

STALL_S = 0.3


def hold_the_loop(seconds: float) -> None:
    """What a blocking handler does: keep the loop's thread busy."""
    time.sleep(seconds)


async def test_a_stalled_loop_shows_as_lag_at_least_as_long_as_the_stall() -> None:
    metrics = FleetMetrics()
    value = metrics.registry.get_sample_value
    probe = asyncio.create_task(probe_loop_lag(metrics.loop_lag, interval=0.01))
    try:
        await asyncio.sleep(0.05)  # the probe sleeps; nothing holds the loop
        hold_the_loop(STALL_S)
        await asyncio.sleep(0.05)  # the probe wakes (late) and records it
    finally:
        probe.cancel()
    count = value("kernelfleet_event_loop_lag_seconds_count") or 0
    assert count >= 2
    # the sleeper due during the stall woke after it: at least (stall - interval) late
    assert (value("kernelfleet_event_loop_lag_seconds_bucket", {"le": "0.25"}) or 0) <= count - 1
    assert (value("kernelfleet_event_loop_lag_seconds_sum") or 0) >= STALL_S - 0.01


@pytest.mark.timeout(90)
def test_a_live_gateway_exports_its_loop_lag_and_heartbeat_times(fleet: Fleet) -> None:
    def counted(name: str) -> float:
        for line in fleet.request_text("GET", "/metrics").splitlines():
            if line.startswith(f"{name}_count "):
                return float(line.split()[1])
        raise AssertionError(f"{name} is not on /metrics")

    lag, beats = (
        counted("kernelfleet_event_loop_lag_seconds"),
        counted("kernelfleet_host_report_seconds"),
    )
    wait_for(
        lambda: (
            counted("kernelfleet_event_loop_lag_seconds") > lag
            and counted("kernelfleet_host_report_seconds") > beats
        ),
        30,
        "the probe and a heartbeat to be counted",
    )
