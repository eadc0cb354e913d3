"""What the gateway says about its fleet, polled into gauges over trace time.

Every ``interval_s`` wall seconds: ``GET /api/fleet/hosts`` gives the provisioned GPUs (the
``gpus.total`` of every ``alive`` host) and the committed GPUs (their ``gpus.committed``);
``GET /api/fleet/kernels`` gives the hosts of the replay's kernels' replicas. A host id that
turns alive after the first poll counts as a scale-out, one that stops being alive as a scale-in
(a lost host too); a replica host that a kernel of ours gains while keeping its kernel id counts
as a migration. Changes between two polls are seen only if they outlast the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kernelfleet.replay.client import GatewayClient, ReplayError
from kernelfleet.scheduler.simulator.metrics import Gauge

log = logging.getLogger("kernelfleet.replay.meter")


class FleetMeter:
    """Polls the admin API; `clock` gives the current trace time in seconds, and the gauges
    start at trace time 0 (the replay's origin), where `run` is to be started."""

    def __init__(self, client: GatewayClient, clock: Callable[[], float], interval_s: float):
        self.client = client
        self.clock = clock
        self.interval_s = interval_s
        self.provisioned = Gauge(0.0)
        self.committed = Gauge(0.0)
        self.kernel_ids: set[str] = set()  # the replay's own kernels, added by the driver
        self.scale_outs = 0
        self.scale_ins = 0
        self.migrations = 0
        self.failed_polls = 0
        self.peak_hosts = 0
        self.hosts_seen: dict[str, int] = {}  # host id -> GPUs, as first seen alive
        self.closed = False
        self._alive: set[str] | None = None
        self._replica_hosts: dict[str, set[str]] = {}

    async def poll(self) -> None:
        """One poll; a failed call is counted and logged, and the gauges keep their values."""
        try:
            hosts = await self.client.hosts()
            kernels = await self.client.kernels() if self.kernel_ids else []
        except ReplayError as error:
            self.failed_polls += 1
            log.warning("polling the fleet failed: %s", error.message)
            return
        if self.closed:
            return  # answered after the measured window ended
        now = self.clock()
        alive = {h["id"]: h for h in hosts if h.get("state") == "alive"}
        self.provisioned.set(now, sum(_gpus(h, "total") for h in alive.values()))
        self.committed.set(now, sum(_gpus(h, "committed") for h in alive.values()))
        for host_id, host in alive.items():
            self.hosts_seen.setdefault(host_id, _gpus(host, "total"))
        self.peak_hosts = max(self.peak_hosts, len(alive))
        if self._alive is not None:
            self.scale_outs += len(alive.keys() - self._alive)
            self.scale_ins += len(self._alive - alive.keys())
        self._alive = set(alive)
        self._count_migrations(kernels)

    def _count_migrations(self, kernels: list[dict[str, Any]]) -> None:
        for kernel in kernels:
            if kernel.get("id") not in self.kernel_ids:
                continue
            hosts = {r["host"] for r in kernel.get("replicas", []) if r.get("state") != "dead"}
            before = self._replica_hosts.get(kernel["id"])
            if before is not None:
                self.migrations += len(hosts - before)
            self._replica_hosts[kernel["id"]] = hosts

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    def close(self) -> None:
        """End the measured window now; later polls are ignored."""
        if self.closed:
            return
        self.closed = True
        now = max(self.clock(), self.provisioned.history[-1][0], self.committed.history[-1][0])
        self.provisioned.close(now)
        self.committed.close(now)


def _gpus(host: dict[str, Any], field: str) -> int:
    gpus = host.get("gpus")
    value = gpus.get(field, 0) if isinstance(gpus, dict) else 0
    return int(value) if isinstance(value, int | float) else 0
