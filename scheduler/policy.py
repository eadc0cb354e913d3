"""The policy interface and its entry-point registry (group ``kernelfleet.policies``)."""

from __future__ import annotations

import abc
import enum
import inspect
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from kernelfleet.errors import InvalidRequest, NoCapacity
from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.decisions import (
    AdmitDecision,
    AutoscaleDecision,
    ExecutorDecision,
    Hold,
    Placement,
    Queue,
    QueueReason,
    Reject,
    RejectReason,
    RunOn,
)
from kernelfleet.scheduler.snapshot import FleetSnapshot, KernelSnapshot

ENTRY_POINT_GROUP = "kernelfleet.policies"

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExecuteRequest",
    "GpuBinding",
    "Placement",
    "PlacementRequest",
    "Policy",
    "StateSync",
    "available_policies",
    "load_policy",
]


class GpuBinding(enum.Enum):
    """When a policy's kernels hold GPUs."""

    PER_CELL = "per-cell"  # committed when a cell starts, released when it ends
    PER_SESSION = "per-session"  # committed when the kernel is admitted, released at its end


class StateSync(enum.Enum):
    """Where a kernel's state is saved and restored relative to a cell's execution."""

    OFF_CRITICAL_PATH = "off-critical-path"  # replicas stay warm; sync after the reply
    ON_CRITICAL_PATH = "on-critical-path"  # fresh container: load before, save after, GPUs held


@dataclass(frozen=True)
class PlacementRequest:
    """A new kernel: how many replicas (each on a distinct host) and its default GPU need.
    ``spot_places``: how many of the hosts asked for may be spot hosts; None: the policy's rule
    for a kernel of `replicas` replicas (a new replica of a larger kernel says what its others
    leave)."""

    kernel_id: str
    replicas: int = 1
    gpus: int = 0
    spot_places: int | None = None


@dataclass(frozen=True)
class ExecuteRequest:
    """A cell of `kernel` that needs `gpus` GPUs (the kernel's default or a per-cell override)."""

    kernel: KernelSnapshot
    gpus: int


class Policy(abc.ABC):
    """A scheduling policy. Subclasses are registered under the ``kernelfleet.policies`` group.

    Every method is a pure function of its arguments: no I/O, no clock, no hidden state that
    changes between calls. The gateway and the simulator both call `admit` when a kernel starts
    (the gateway then calls `place` for the reason when it gives up waiting), `place` alone to
    re-place a restarted kernel, a lost replica or one that moves, `choose_executor` at each
    cell and `autoscale` every autoscaling round. The class attributes tell the caller how to
    execute the decisions: how many replicas a kernel has, when GPUs are bound, and
    whether state sync sits on a cell's critical path. ``max_spot_replicas``: how many of a
    kernel's replicas the built-in policies put on spot hosts; None (the default) is the
    majority rule of `kernelfleet.scheduler.hostkinds` (at most one of 3), which a revocation
    never costs a kernel; another value is for measuring what breaking it costs.
    """

    name: str = ""
    replicas: int = 1
    binding: GpuBinding = GpuBinding.PER_CELL
    state_sync: StateSync = StateSync.OFF_CRITICAL_PATH
    max_spot_replicas: int | None = None

    @abc.abstractmethod
    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        """Choose ``request.replicas`` distinct alive hosts, or raise `NoCapacity` saying why."""

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        """Admit a new kernel: a `Placement`, or what to do instead. By default, `place`
        with `NoCapacity` turned into waiting for hosts."""
        try:
            return self.place(snapshot, request)
        except NoCapacity as error:
            return Queue(QueueReason.WAITING_FOR_HOSTS, error.message)

    def choose_executor(self, snapshot: FleetSnapshot, request: ExecuteRequest) -> ExecutorDecision:
        """Pick the replica that runs a cell. By default: the previous executor's host if it can
        commit the GPUs, else the first replica host that can, else wait."""
        kernel = request.kernel
        if not kernel.replica_hosts:
            return Reject(RejectReason.NO_REPLICAS, f"kernel {kernel.id} has no replica")
        order = [kernel.executor_host] if kernel.executor_host in kernel.replica_hosts else []
        for host_id in [*order, *kernel.replica_hosts]:
            host = snapshot.host(host_id) if host_id else None
            if host is not None and host.can_commit(request.gpus):
                return RunOn(host.id)
        return Queue(QueueReason.WAITING_FOR_GPUS)

    def autoscale(self, snapshot: FleetSnapshot) -> AutoscaleDecision:
        """One autoscaling round. By default the fleet is fixed: `Hold`."""
        return Hold()


def available_policies() -> list[str]:
    """The names of the policies registered as entry points and of this package's own."""
    installed = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(installed | set(_shipped()))


def load_policy(name: str, autoscaling: AutoscaleConfig | None = None) -> Policy:
    """Instantiate the policy registered as `name` (an entry point, else one this package
    ships: `registry.SHIPPED_POLICIES`), with the autoscaler parameters `autoscaling` if it
    takes them (its defaults otherwise); `InvalidRequest` lists the known names."""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches and name not in _shipped():
        raise InvalidRequest(
            f"unknown policy {name!r}; installed policies: {', '.join(available_policies())}"
        )
    policy_class: Any = matches[0].load() if matches else _shipped()[name]
    if autoscaling is not None and "autoscaling" in inspect.signature(policy_class).parameters:
        return policy_class(autoscaling=autoscaling)
    return policy_class()


def _shipped() -> dict[str, type[Policy]]:
    # imported here: the shipped policies import this module
    from kernelfleet.scheduler.registry import SHIPPED_POLICIES

    return SHIPPED_POLICIES
