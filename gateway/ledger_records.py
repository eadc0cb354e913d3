"""The records the GPU ledger hands out: claims, bindings, what a commit did, and its views.

Plain frozen data (see `kernelfleet.gateway.ledger` for what each layer means).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ReplicaKey = tuple[str, str]
"""(kernel id, replica id)."""


@dataclass(frozen=True)
class Claim:
    """A replica's GPU need on its host (subscribed, not exclusive)."""

    host_id: str
    kernel_id: str
    replica_id: str
    gpus: int


@dataclass(frozen=True)
class Binding:
    """Devices bound exclusively to cell `cell_id` of a replica (committed)."""

    host_id: str
    kernel_id: str
    replica_id: str
    cell_id: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Commitment:
    """What `commit` did: the binding, and what the caller must do before the cell starts.

    ``displaced``: other replicas whose memory may still be warm on the bound devices; each must
    offload (and the caller then calls `mark_cold`) before the cell runs. ``moved``: this
    replica had warm memory on devices it did not get back; it must offload and reload it onto
    the new devices.
    """

    binding: Binding
    displaced: tuple[ReplicaKey, ...] = ()
    moved: bool = False
    preempted: tuple[str, ...] = ()
    """Background jobs whose lent devices this binding took (cells first): each must be
    stopped before the cell starts (`kernelfleet.gateway.jobs`)."""

    @property
    def device_ids(self) -> tuple[str, ...]:
        return self.binding.device_ids


@dataclass(frozen=True)
class WorkerHold:
    """Devices held for the tool workers `group_id` of kernel `kernel_id` (`GpuLedger.hold`):
    exclusive like a binding, but on any host and outside the kernel's replicas."""

    kernel_id: str
    group_id: str


@dataclass(frozen=True)
class HostGpuView:
    """One host's GPUs for the admin API (`to_dict`)."""

    id: str
    device_ids: tuple[str, ...]
    subscribed: int
    committed: int
    bound: dict[str, Binding]
    vanished: tuple[str, ...]
    warm: dict[str, ReplicaKey]
    lent: dict[str, str] | None = None
    """Device -> the background job it is lent to (devices no cell holds)."""
    held: dict[str, WorkerHold] | None = None
    """Device -> the kernel's tool workers it is held for (`GpuLedger.hold`)."""

    @property
    def total(self) -> int:
        return len(self.device_ids)

    @property
    def idle(self) -> int:
        return self.total - self.committed

    @property
    def over_committed(self) -> bool:
        return bool(self.vanished)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "subscribed": self.subscribed,
            "committed": self.committed,
            "idle": self.idle,
            "devices": list(self.device_ids),
            "committed_devices": {
                device: {"kernel": b.kernel_id, "replica": b.replica_id, "cell": b.cell_id}
                for device, b in sorted(self.bound.items())
            },
            "vanished": list(self.vanished),
            "over_committed": self.over_committed,
            "warm": {d: {"kernel": k, "replica": r} for d, (k, r) in sorted(self.warm.items())},
        }


@dataclass(frozen=True)
class LedgerTotals:
    """Fleet-wide counts: GPUs the hosts have, claimed by idle replicas (subscribed), claimed by
    every replica (demand), and bound to running cells (committed)."""

    total: int
    subscribed: int
    demand: int
    committed: int
