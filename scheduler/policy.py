"""The policy interface and its entry-point registry (group ``kernelfleet.policies``)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from importlib.metadata import entry_points

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.snapshot import FleetSnapshot

ENTRY_POINT_GROUP = "kernelfleet.policies"


@dataclass(frozen=True)
class PlacementRequest:
    """A new kernel: how many replicas (each on a distinct host) and its default GPU need."""

    kernel_id: str
    replicas: int = 1
    gpus: int = 0


@dataclass(frozen=True)
class Placement:
    """The hosts chosen for a kernel's replicas, in replica order."""

    host_ids: tuple[str, ...]


class Policy(abc.ABC):
    """A scheduling policy. Subclasses are registered under the ``kernelfleet.policies`` group.

    Every method is a pure function of its arguments: no I/O, no clock, no hidden state that
    changes between calls. The gateway calls `place` when a kernel is created or restarted on
    lost hosts; the simulator calls it at each simulated session start.
    """

    name: str = ""

    @abc.abstractmethod
    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        """Choose ``request.replicas`` distinct alive hosts, or raise `NoCapacity` saying why."""


def available_policies() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_policy(name: str) -> Policy:
    """Instantiate the policy registered as `name`; `InvalidRequest` lists the known names."""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise InvalidRequest(
            f"unknown policy {name!r}; installed policies: {', '.join(available_policies())}"
        )
    policy_class = matches[0].load()
    return policy_class()
