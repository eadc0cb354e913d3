"""The simulated fleet: hosts with a GPU ledger, kernels with replicas, and their snapshots.

Only the engine mutates it, through the methods here, which keep the ledger consistent:
a host's ``subscribed`` is the sum of its replicas' GPU needs and ``committed`` never exceeds its
GPUs (`LedgerError` otherwise — a bug in the engine or a policy, never silently absorbed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelfleet.scheduler.hostkinds import ON_DEMAND, SPOT
from kernelfleet.scheduler.snapshot import (
    NO_ARRIVALS,
    ArrivalStats,
    FleetSnapshot,
    HostSnapshot,
    KernelSnapshot,
)


class LedgerError(RuntimeError):
    """A decision that the GPU ledger cannot honour (a policy or engine bug)."""


@dataclass
class SimHost:
    id: str
    gpus: int
    subscribed: int = 0
    committed: int = 0
    kernels: set[str] = field(default_factory=set)
    started_at: float = 0.0
    idle_since: float = 0.0  # when `committed` last fell to 0
    kind: str = ON_DEMAND
    _snapshot: HostSnapshot | None = None

    def snapshot(self) -> HostSnapshot:
        if self._snapshot is None:
            self._snapshot = HostSnapshot(
                self.id,
                self.gpus,
                self.subscribed,
                self.committed,
                len(self.kernels),
                started_at=self.started_at,
                idle_since=self.idle_since,
                kind=self.kind,
            )
        return self._snapshot


@dataclass
class SimKernel:
    id: str
    gpus: int
    replica_hosts: list[str] = field(default_factory=list)
    executor_host: str | None = None
    reserved_host: str | None = None
    replacing: dict[str, float] = field(default_factory=dict)
    """Replicas being re-created after a revocation: host -> when it is caught up (the
    engine's; a replica still catching up is not a live member yet)."""

    def snapshot(self, now: float = 0.0) -> KernelSnapshot:
        """The kernel at `now` (which replicas are still catching up)."""
        return KernelSnapshot(
            self.id,
            self.gpus,
            tuple(self.replica_hosts),
            self.executor_host,
            self.catching_up(now),
        )

    def catching_up(self, now: float) -> tuple[str, ...]:
        """Hosts of the replicas still catching up at `now`."""
        return tuple(h for h, until in self.replacing.items() if until > now)


class Cluster:
    """Hosts by id (alive ones only), kernels by id, hosts being added (``pending``, of which
    ``pending_spot`` are spot), and a change counter. ``now`` is the engine's clock, which dates
    hosts' starts and idle periods."""

    def __init__(self, gpus_per_host: int) -> None:
        self.gpus_per_host = gpus_per_host
        self.hosts: dict[str, SimHost] = {}
        self.kernels: dict[str, SimKernel] = {}
        self.pending = 0
        self.pending_spot = 0
        self.spot_hosts = 0
        self.version = 0
        self.now = 0.0
        self._committed = 0
        self._next_host = 0
        self._snapshot_hosts: tuple[HostSnapshot, ...] | None = None

    # ---- hosts ---------------------------------------------------------------------------

    def add_host(self, kind: str = ON_DEMAND) -> SimHost:
        self._next_host += 1
        host = SimHost(
            f"h{self._next_host}",
            self.gpus_per_host,
            started_at=self.now,
            idle_since=self.now,
            kind=kind,
        )
        self.hosts[host.id] = host
        self.spot_hosts += kind == SPOT
        self._changed(None)
        return host

    def remove_host(self, host_id: str) -> None:
        host = self.hosts[host_id]
        if host.committed or host.kernels:
            raise LedgerError(f"host {host_id} still holds GPUs or replicas")
        del self.hosts[host_id]
        self.spot_hosts -= host.kind == SPOT
        self._changed(None)

    @property
    def committed(self) -> int:
        """GPUs committed on all hosts (kept as a running total: it is read at every event)."""
        return self._committed

    def commit(self, host_id: str, gpus: int) -> None:
        host = self.hosts[host_id]
        if host.committed + gpus > host.gpus:
            raise LedgerError(f"host {host_id}: {host.committed}+{gpus} > {host.gpus} GPUs")
        host.committed += gpus
        self._committed += gpus
        self._changed(host)

    def release(self, host_id: str, gpus: int) -> None:
        host = self.hosts[host_id]
        if gpus > host.committed:
            raise LedgerError(f"host {host_id}: releasing {gpus} of {host.committed} GPUs")
        host.committed -= gpus
        self._committed -= gpus
        if host.committed == 0:
            host.idle_since = self.now
        self._changed(host)

    # ---- kernels and replicas ------------------------------------------------------------

    def add_kernel(self, kernel: SimKernel, host_ids: tuple[str, ...]) -> None:
        self.kernels[kernel.id] = kernel
        for host_id in host_ids:
            self.add_replica(kernel, host_id)

    def remove_kernel(self, kernel_id: str) -> None:
        kernel = self.kernels.pop(kernel_id)
        for host_id in list(kernel.replica_hosts):
            self.remove_replica(kernel, host_id)

    def add_replica(self, kernel: SimKernel, host_id: str) -> None:
        host = self.hosts[host_id]
        if kernel.id in host.kernels:
            raise LedgerError(f"kernel {kernel.id} already has a replica on {host_id}")
        host.kernels.add(kernel.id)
        host.subscribed += kernel.gpus
        kernel.replica_hosts.append(host_id)
        self._changed(host)

    def remove_replica(self, kernel: SimKernel, host_id: str) -> None:
        host = self.hosts[host_id]
        host.kernels.discard(kernel.id)
        host.subscribed -= kernel.gpus
        kernel.replica_hosts.remove(host_id)
        if kernel.executor_host == host_id:
            kernel.executor_host = None
        self._changed(host)

    def move_replica(self, kernel: SimKernel, from_host: str, to_host: str) -> None:
        self.remove_replica(kernel, from_host)
        self.add_replica(kernel, to_host)

    # ---- snapshots -----------------------------------------------------------------------

    def snapshot(
        self,
        now: float,
        demand: float,
        busy: float,
        waiting: int,
        arrivals: ArrivalStats = NO_ARRIVALS,
        predicted: float | None = None,
    ) -> FleetSnapshot:
        """The fleet as policies see it; host snapshots are rebuilt only where changed."""
        if self._snapshot_hosts is None:
            self._snapshot_hosts = tuple(host.snapshot() for host in self.hosts.values())
        return FleetSnapshot(
            hosts=self._snapshot_hosts,
            now=now,
            gpus_per_host=self.gpus_per_host,
            hosts_pending=self.pending,
            demand_gpus=demand,
            busy_gpus=busy,
            gpus_waiting=waiting,
            arrivals=arrivals,
            predicted_gpus=predicted,
        )

    def _changed(self, host: SimHost | None) -> None:
        if host is not None:
            host._snapshot = None
        self._snapshot_hosts = None
        self.version += 1
