"""The autoscaling rule: NotebookOS's formula (docs/notebookos.md), with warm capacity and
hysteresis (docs/economics.md), as a pure function of the snapshot.

Every round, the GPUs wanted are ``committed GPUs (+ queued ones) * headroom + warm GPUs``, and:

- **scale out** to ``target = ceil(wanted / GPUs per host) + buffer hosts`` (within ``min_hosts``
  and ``max_hosts``; 0: no limit) when the hosts alive and being added are fewer;
- **scale in** only above the higher ``target_in``, the same formula with ``scale_in_headroom``
  (a band between the two targets where nothing changes), releasing at most ``max_scale_in``
  hosts that have no committed GPU, have had none for ``scale_in_idle_s`` and have been up for
  ``min_host_lifetime_s``; those with fewest replicas first, then by id.

The warm GPUs (`warm_gpus`) are the GPUs that the cells arriving within the provisioning lead
time ``warm_lead_s`` need, at the quantile ``warm_quantile`` (0: none, NotebookOS's formula).
With a demand model (``snapshot.predicted_gpus``, docs/economics.md) the GPUs wanted are at
least the predicted busy GPUs times the headroom (the scale-in headroom for the scale-in
target, so predictions have the same band as demand): capacity is added before the cells that
need it arrive, and kept while the model expects them. With every new knob at its default and
no model the rule is NotebookOS's formula unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from statistics import NormalDist

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.decisions import AutoscaleDecision, Hold, ScaleIn, ScaleOut
from kernelfleet.scheduler.snapshot import ArrivalStats, FleetSnapshot, HostSnapshot


@dataclass(frozen=True)
class AutoscaleConfig:
    """The rule's parameters. ``count_waiting`` adds the GPUs of queued requests to the
    committed GPUs (a kernelfleet addition: NotebookOS scales out only when a cell finds no host).
    ``scale_in_headroom`` 0 means the same as ``headroom`` (no band). Negative values, a
    headroom below 1 and a quantile outside [0, 1) are refused with the field named.
    """

    headroom: float = 1.05
    buffer_hosts: int = 1
    max_scale_in: int = 2
    min_hosts: int = 3
    max_hosts: int = 0
    count_waiting: bool = True
    scale_in_headroom: float = 0.0
    scale_in_idle_s: float = 0.0
    min_host_lifetime_s: float = 0.0
    warm_quantile: float = 0.0
    warm_lead_s: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not isinstance(value, bool) and not value >= 0:  # also refuses NaN
                raise InvalidRequest(f"autoscaling parameter {item.name} must be >= 0, not {value}")
        if self.headroom < 1:
            raise InvalidRequest(
                f"autoscaling parameter headroom must be >= 1, not {self.headroom}"
            )
        if self.scale_in_headroom and self.scale_in_headroom < self.headroom:
            raise InvalidRequest(
                f"autoscaling parameter scale_in_headroom ({self.scale_in_headroom}) must be 0 "
                f"or >= headroom ({self.headroom})"
            )
        if self.warm_quantile >= 1:
            raise InvalidRequest(
                f"autoscaling parameter warm_quantile must be below 1, not {self.warm_quantile}"
            )


def warm_gpus(arrivals: ArrivalStats, config: AutoscaleConfig) -> int:
    """Idle GPUs to keep ready: the ``warm_quantile`` of the GPUs needed by the cells arriving
    in the next ``warm_lead_s`` seconds, rounded up.

    Arrivals are taken as a Poisson process at the recent rate ``λ`` whose cells need ``g`` GPUs
    as recently seen, so the GPUs ``G`` arriving within ``L = warm_lead_s`` are compound Poisson
    with mean ``λL·E[g]`` and variance ``λL·E[g²]``; the normal approximation gives
    ``G_q = λL·E[g] + z_q·sqrt(λL·E[g²])``, ``z_q`` the standard normal quantile. 0 when the
    quantile or the lead time is 0, or no cell arrived in the window.
    """
    if config.warm_quantile <= 0 or config.warm_lead_s <= 0 or arrivals.cells == 0:
        return 0
    expected = arrivals.rate * config.warm_lead_s
    mean_gpus = arrivals.gpus / arrivals.cells
    mean_squared = arrivals.gpus_squared / arrivals.cells
    z = NormalDist().inv_cdf(config.warm_quantile)
    quantile = expected * mean_gpus + z * math.sqrt(expected * mean_squared)
    return max(0, math.ceil(round(quantile, 9)))


def _hosts_for(snapshot: FleetSnapshot, config: AutoscaleConfig, headroom: float) -> int:
    size = snapshot.host_size
    if size <= 0:
        return config.min_hosts
    demand = snapshot.gpus_committed + (snapshot.gpus_waiting if config.count_waiting else 0)
    wanted = demand * headroom + warm_gpus(snapshot.arrivals, config)
    if snapshot.predicted_gpus is not None:
        wanted = max(wanted, snapshot.predicted_gpus * headroom)
    # round first: float noise (3 * 1.1 == 3.3000000000000003) must not add a host
    target = math.ceil(round(wanted / size, 9)) + config.buffer_hosts
    target = max(target, config.min_hosts)
    return min(target, config.max_hosts) if config.max_hosts > 0 else target


def target_hosts(snapshot: FleetSnapshot, config: AutoscaleConfig) -> int:
    """How many hosts the fleet should have now (below it: scale out); ``min_hosts`` if the
    host size is unknown."""
    return _hosts_for(snapshot, config, config.headroom)


def scale_in_target(snapshot: FleetSnapshot, config: AutoscaleConfig) -> int:
    """The fewest hosts scale-in leaves (at least `target_hosts`): the target under
    ``scale_in_headroom``."""
    return _hosts_for(snapshot, config, max(config.headroom, config.scale_in_headroom))


def releasable(host: HostSnapshot, now: float, config: AutoscaleConfig) -> bool:
    """Whether scale-in may release `host` at `now`: no committed GPU, idle for
    ``scale_in_idle_s`` and up for ``min_host_lifetime_s``."""
    return (
        host.gpus_committed == 0
        and now - host.idle_since >= config.scale_in_idle_s
        and now - host.started_at >= config.min_host_lifetime_s
    )


def autoscale(snapshot: FleetSnapshot, config: AutoscaleConfig) -> AutoscaleDecision:
    """One round of the rule; see the module docstring."""
    target = target_hosts(snapshot, config)
    alive = snapshot.alive_hosts()
    have = len(alive) + snapshot.hosts_pending
    if have < target:
        return ScaleOut(target - have)
    surplus = min(len(alive) - scale_in_target(snapshot, config), config.max_scale_in)
    if surplus <= 0:
        return Hold()
    now = snapshot.now
    idle = sorted(
        (host for host in alive if releasable(host, now, config)),
        key=lambda h: (h.replicas, h.id),
    )
    chosen = tuple(host.id for host in idle[:surplus])
    return ScaleIn(chosen) if chosen else Hold()
