"""Frozen views of the fleet that policies decide on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostSnapshot:
    """One host as a policy sees it. GPU counts are whole devices."""

    id: str
    gpus_total: int
    gpus_subscribed: int = 0
    gpus_committed: int = 0
    replicas: int = 0
    alive: bool = True

    @property
    def gpus_idle(self) -> int:
        return self.gpus_total - self.gpus_committed


@dataclass(frozen=True)
class FleetSnapshot:
    """Every host, at time ``now`` (seconds on whatever clock the caller runs)."""

    hosts: tuple[HostSnapshot, ...]
    now: float = 0.0

    def alive_hosts(self) -> tuple[HostSnapshot, ...]:
        return tuple(host for host in self.hosts if host.alive)
