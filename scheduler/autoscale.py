"""The autoscaling formula of NotebookOS (docs/notebookos.md), as a pure function.

Every round: target hosts = ceil(committed GPUs * headroom / GPUs per host) + buffer hosts,
never below ``min_hosts`` nor above ``max_hosts`` (0: no limit). Below target (counting hosts
already being added) → `ScaleOut` of the difference; above target → `ScaleIn` of at most
``max_scale_in`` fully idle hosts (no committed GPU), those with fewest replicas first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernelfleet.scheduler.decisions import AutoscaleDecision, Hold, ScaleIn, ScaleOut
from kernelfleet.scheduler.snapshot import FleetSnapshot


@dataclass(frozen=True)
class AutoscaleConfig:
    """The formula's parameters. ``count_waiting`` adds the GPUs of queued requests to the
    committed GPUs (a kernelfleet addition: NotebookOS scales out only when a cell finds no host).
    """

    headroom: float = 1.05
    buffer_hosts: int = 1
    max_scale_in: int = 2
    min_hosts: int = 3
    max_hosts: int = 0
    count_waiting: bool = True


def target_hosts(snapshot: FleetSnapshot, config: AutoscaleConfig) -> int:
    """How many hosts the fleet should have now; ``min_hosts`` if the host size is unknown."""
    size = snapshot.host_size
    if size <= 0:
        return config.min_hosts
    demand = snapshot.gpus_committed + (snapshot.gpus_waiting if config.count_waiting else 0)
    # round first: float noise (3 * 1.1 == 3.3000000000000003) must not add a host
    target = math.ceil(round(demand * config.headroom / size, 9)) + config.buffer_hosts
    target = max(target, config.min_hosts)
    return min(target, config.max_hosts) if config.max_hosts > 0 else target


def autoscale(snapshot: FleetSnapshot, config: AutoscaleConfig) -> AutoscaleDecision:
    """One round of the formula; see the module docstring."""
    target = target_hosts(snapshot, config)
    alive = snapshot.alive_hosts()
    have = len(alive) + snapshot.hosts_pending
    if have < target:
        return ScaleOut(target - have)
    surplus = min(len(alive) - target, config.max_scale_in)
    if surplus <= 0:
        return Hold()
    idle = sorted(
        (host for host in alive if host.gpus_committed == 0), key=lambda h: (h.replicas, h.id)
    )
    chosen = tuple(host.id for host in idle[:surplus])
    return ScaleIn(chosen) if chosen else Hold()
