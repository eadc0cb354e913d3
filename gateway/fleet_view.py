"""The fleet as policies see it, built in one place for the kernel service and the autoscaler.

`FleetView.snapshot` joins what the host registry knows (which hosts take work), what the GPU
ledger knows (each host's GPUs: subscribed by idle replicas, committed to running cells), the
demand waiting for capacity (cells waiting for GPUs, kernels waiting for a host), the usage
window, and, once the autoscaler runs, the hosts on their way and the size of one more (and,
when it keeps warm capacity, the cells submitted recently).

A kernel that runs in containers (its launched kernelspec is one of `container_launches`) is
shown only hosts that can run it: in its snapshot, a host whose agent has no container engine,
or does not reach it, shows as not alive, so no placement, replacement or migration of one of
its replicas goes there.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.scheduler import FleetSnapshot, HostSnapshot
from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.snapshot import NO_ARRIVALS
from kernelfleet.scheduler.usage import UsageWindow


class WaitingCells(Protocol):
    """Cells waiting for GPUs (the `ExecutorChooser`)."""

    @property
    def waiting_gpus(self) -> int:
        """The GPUs they ask for, together."""
        ...


class HostGrowth(Protocol):
    """Who adds hosts (the `Autoscaler`): what policies are told of hosts still to come."""

    def pending(self, alive: set[str]) -> int:
        """Hosts it started that are not among the `alive` (heartbeating) ones yet."""
        ...

    def addable_host_size(self, hosts: int) -> int:
        """GPUs of a host it could add to a fleet of `hosts` (alive and pending); 0 if none."""
        ...


class FleetView:
    """Builds `FleetSnapshot`s; see the module docstring. Holds no state of the fleet itself
    but the GPUs of kernels waiting to be placed (`admitting`)."""

    def __init__(
        self,
        hosts: HostRegistry,
        ledger: GpuLedger,
        cells: WaitingCells,
        usage: UsageWindow,
        container_launches: frozenset[str] = frozenset(),
    ) -> None:
        self._hosts = hosts
        self._container_launches = container_launches
        self._ledger = ledger
        self._cells = cells
        self.usage = usage
        """Demand and busy GPUs over a moving window, for the subscription ratio."""
        self._growth: HostGrowth | None = None
        self._admitting: dict[str, int] = {}
        """GPUs of kernels waiting for a host to be placed on, by kernel id."""
        self.arrivals: ArrivalWindow | None = None
        """The cells submitted recently (on `time.monotonic`), once the autoscaler keeps warm
        capacity; until then snapshots count none."""

    def grow_with(self, growth: HostGrowth) -> None:
        """From now on, tell policies the hosts `growth` is adding and whether more can come
        (the app calls this once, when its autoscaler starts; until then no host is coming)."""
        self._growth = growth

    def in_containers(self, launch_name: str) -> bool:
        """Whether kernels launched as `launch_name` run in containers."""
        return launch_name in self._container_launches

    def snapshot(self, launch_name: str = "") -> FleetSnapshot:
        """The fleet now, as a kernel launched as `launch_name` may use it ("": any kernel). A
        host that does not take work (draining, stopping, lost), or cannot run such a kernel
        (see the module docstring), shows as not alive, so nothing new of it is placed or run
        there."""
        registered = self._hosts.all()
        in_ledger = set(self._ledger.hosts())
        containers = self.in_containers(launch_name)

        def usable(host: HostRecord) -> bool:
            return host.takes_work and (host.runs_containers or not containers)

        hosts = [
            replace(self._ledger.host_snapshot(host.id, usable(host)), kind=host.kind)
            if host.id in in_ledger
            else HostSnapshot(
                id=host.id, gpus_total=len(host.gpus), alive=usable(host), kind=host.kind
            )
            for host in registered
        ]
        pending, addable = 0, 0
        if self._growth is not None:
            alive = {host.id for host in registered if host.alive}
            pending = self._growth.pending(alive)
            addable = self._growth.addable_host_size(len(alive) + pending)
        return FleetSnapshot(
            hosts=tuple(hosts),
            gpus_per_host=addable,
            hosts_pending=pending,
            demand_gpus=self.usage.demand,
            busy_gpus=self.usage.busy,
            gpus_waiting=self._cells.waiting_gpus + sum(self._admitting.values()),
            arrivals=NO_ARRIVALS
            if self.arrivals is None
            else self.arrivals.stats(time.monotonic()),
        )

    def snapshot_without(self, host_ids: set[str], launch_name: str = "") -> FleetSnapshot:
        """The hosts of `snapshot(launch_name)` but `host_ids` (where a kernel's new replica may
        go: not beside its others), and nothing else of it."""
        snapshot = self.snapshot(launch_name)
        hosts = tuple(host for host in snapshot.hosts if host.id not in host_ids)
        return FleetSnapshot(hosts=hosts, now=snapshot.now)

    def admitting(self, kernel_id: str, gpus: int) -> None:
        """Kernel `kernel_id` waits for a host: its `gpus` count as waiting demand."""
        self._admitting[kernel_id] = gpus

    def admitted(self, kernel_id: str) -> None:
        """Kernel `kernel_id` waits no more (placed, or given up)."""
        self._admitting.pop(kernel_id, None)

    def sample_usage(self) -> None:
        """Add the GPUs subscribed by every replica (demand) and committed now (busy) to the
        moving window; the caller calls this at a fixed interval."""
        totals = self._ledger.totals()
        self.usage.add(totals.demand, totals.committed)
