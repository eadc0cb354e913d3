"""Pure decision code: placement, executor choice, migration and autoscaling, and the order in
which waiting cells are served (`kernelfleet.scheduler.waiting`); and the trace-driven simulator
that drives the same policies and waiting order (`kernelfleet.scheduler.simulator`).

Nothing in the policies does I/O or reads a clock: a policy gets a frozen `FleetSnapshot` (with
``now`` as a field) and returns a decision (`kernelfleet.scheduler.decisions`). The live gateway
and the simulator call the very same policies.
"""

from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.decisions import (
    Hold,
    Migrate,
    Placement,
    Queue,
    QueueReason,
    Reject,
    RejectReason,
    RunOn,
    ScaleIn,
    ScaleOut,
)
from kernelfleet.scheduler.policy import (
    ExecuteRequest,
    GpuBinding,
    PlacementRequest,
    Policy,
    StateSync,
    load_policy,
)
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot, KernelSnapshot

__all__ = [
    "AutoscaleConfig",
    "ExecuteRequest",
    "FleetSnapshot",
    "GpuBinding",
    "Hold",
    "HostSnapshot",
    "KernelSnapshot",
    "Migrate",
    "Placement",
    "PlacementRequest",
    "Policy",
    "Queue",
    "QueueReason",
    "Reject",
    "RejectReason",
    "RunOn",
    "ScaleIn",
    "ScaleOut",
    "StateSync",
    "load_policy",
]
