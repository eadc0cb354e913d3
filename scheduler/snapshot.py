"""Frozen views of the fleet that policies decide on.

Every field added since the first version has a default, so callers that only know hosts (the
gateway's placement) keep working unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class HostSnapshot:
    """One host as a policy sees it. GPU counts are whole devices.

    ``gpus_subscribed`` sums the GPU needs of every replica on the host (claims, not
    exclusive: a running cell's replica is counted here and in ``gpus_committed``);
    ``gpus_committed`` counts GPUs bound to a running cell (or, for a reserving policy, to a
    session). ``free_gpu_speeds``: the relative speeds of the GPUs no cell holds, fastest first
    (1.0: a typical GPU of its type); empty when the caller does not know them (the simulator),
    which `free_speed` takes for 1.0. ``started_at``: when the host came up; ``idle_since``:
    when its last committed GPU was released (meaningful only while none is committed); both on
    the snapshot's clock, and -inf (up and idle since forever) when the caller does not know.
    ``kind``: ``on-demand`` or ``spot`` (revocable; `kernelfleet.scheduler.hostkinds`).
    """

    id: str
    gpus_total: int
    gpus_subscribed: int = 0
    gpus_committed: int = 0
    replicas: int = 0
    alive: bool = True
    free_gpu_speeds: tuple[float, ...] = ()
    started_at: float = -math.inf
    idle_since: float = -math.inf
    kind: str = "on-demand"

    def free_speed(self, gpus: int) -> float:
        """How fast a cell needing `gpus` GPUs would run here: the slowest of the `gpus`
        fastest free GPUs (a multi-GPU cell waits for its slowest). 1.0 when unknown."""
        if gpus <= 0 or len(self.free_gpu_speeds) < gpus:
            return 1.0
        return self.free_gpu_speeds[gpus - 1]

    @property
    def gpus_idle(self) -> int:
        return self.gpus_total - self.gpus_committed

    def can_commit(self, gpus: int) -> bool:
        """Whether a cell needing `gpus` GPUs could start on this host now."""
        return self.alive and self.gpus_idle >= gpus

    def subscription_ratio(self, extra_gpus: int = 0) -> float:
        """Subscribed GPUs (plus `extra_gpus`) per GPU of the host; 0 for a GPU-less host."""
        if self.gpus_total <= 0:
            return 0.0
        return (self.gpus_subscribed + extra_gpus) / self.gpus_total


@dataclass(frozen=True)
class KernelSnapshot:
    """One kernel: its GPU need, the hosts of its replicas, and its last executor's host.
    ``catching_up``: those of `replica_hosts` whose replica is new and not yet a live member
    of its Raft group (a replacement still copying the state)."""

    id: str
    gpus: int = 0
    replica_hosts: tuple[str, ...] = ()
    executor_host: str | None = None
    catching_up: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArrivalStats:
    """The cells that arrived in the last ``window_s`` seconds: how many, the sum of their GPU
    needs and the sum of the squares of those needs (the moments the warm target needs)."""

    window_s: float = 0.0
    cells: int = 0
    gpus: int = 0
    gpus_squared: int = 0

    @property
    def rate(self) -> float:
        """Cells per second; 0 over an empty window."""
        return self.cells / self.window_s if self.window_s > 0 else 0.0


NO_ARRIVALS = ArrivalStats()
"""No arrival counted: the snapshot of a caller that does not count them."""


@dataclass(frozen=True)
class FleetSnapshot:
    """Every host, at time ``now`` (seconds on whatever clock the caller runs).

    ``demand_gpus`` and ``busy_gpus`` are the caller's moving-window averages of the GPUs
    subscribed by all replicas (the sum of the hosts' ``gpus_subscribed``, so that the cluster
    ratio and a host's ratio are in the same unit) and of the GPUs committed to running cells;
    they give the cluster subscription ratio. ``hosts_pending`` counts hosts asked for but not
    yet up; ``gpus_waiting`` the GPUs of cells and sessions queued for capacity.
    ``gpus_per_host`` is the size of a host the autoscaler would add; 0 when none will be added
    (then sizes are those of the alive hosts). ``arrivals``: the recent cell arrivals the
    caller counted (none by default: then the autoscaler keeps no warm capacity).
    ``predicted_gpus``: the busy GPUs the caller's demand model expects within the provisioning
    lead time, its margin included (`demand_model.Forecaster`); None (the default) when there is
    no model, and the autoscaler follows demand as it is.
    """

    hosts: tuple[HostSnapshot, ...]
    now: float = 0.0
    kernels: tuple[KernelSnapshot, ...] = ()
    gpus_per_host: int = 0
    hosts_pending: int = 0
    demand_gpus: float = 0.0
    busy_gpus: float = 0.0
    gpus_waiting: int = 0
    arrivals: ArrivalStats = NO_ARRIVALS
    predicted_gpus: float | None = None
    _index: dict[str, HostSnapshot] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def alive_hosts(self) -> tuple[HostSnapshot, ...]:
        return tuple(host for host in self.hosts if host.alive)

    def host(self, host_id: str) -> HostSnapshot | None:
        """The host called `host_id`, or None if the snapshot has no such host."""
        if not self._index:
            self._index.update((host.id, host) for host in self.hosts)
        return self._index.get(host_id)

    @cached_property
    def host_size(self) -> int:
        """GPUs per host for autoscaling: ``gpus_per_host`` or the largest alive host's."""
        if self.gpus_per_host > 0:
            return self.gpus_per_host
        return max((host.gpus_total for host in self.alive_hosts()), default=0)

    @property
    def gpus_committed(self) -> int:
        return sum(host.gpus_committed for host in self.hosts if host.alive)
