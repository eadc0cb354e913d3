"""How late the gateway's event loop runs what is due.

Everything the gateway does runs on one asyncio loop: relaying cells, answering REST calls,
applying heartbeats. A callback that holds the loop (a large JSON dump, an fsync, a walk over
every kernel) delays every frame and heartbeat queued behind it. `probe_loop_lag` sees such
stalls from outside: it sleeps a fixed interval again and again and records, into a histogram
(``kernelfleet_event_loop_lag_seconds`` on ``/metrics``), how much later than asked it woke.
A stall of S seconds shows as one sample between S minus one interval and S, taken at its end.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

LOOP_LAG_INTERVAL = 0.1
"""Seconds between the probe's wake-ups: 10 samples a second, negligible work."""


async def probe_loop_lag(lag: Histogram, interval: float = LOOP_LAG_INTERVAL) -> None:
    """Observe, into `lag`, how late each of an endless series of `interval`-second sleeps
    wakes (never negative); runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        lag.observe(max(0.0, loop.time() - due))
