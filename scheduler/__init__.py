"""Pure decision code: placement now; executor choice, migration and autoscaling later.

Nothing here does I/O or reads a clock: a policy gets a frozen `FleetSnapshot` (with ``now`` as
a field) and returns a decision. The live gateway and the trace-driven simulator call the very
same policies.
"""

from kernelfleet.scheduler.policy import Placement, PlacementRequest, Policy, load_policy
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot

__all__ = [
    "FleetSnapshot",
    "HostSnapshot",
    "Placement",
    "PlacementRequest",
    "Policy",
    "load_policy",
]
