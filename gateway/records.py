"""The gateway's records of kernels and their replicas, and how kernels replicate.

Plain data with the conversions the APIs and the store need; the behaviour is in
``kernel_service``.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.channels import ConnectionInfo, KernelLink

MODEL_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # jupyter_server needs the microseconds and the Z


@dataclass
class ReplicaRecord:
    """One process of a kernel, on one host."""

    id: str
    host_id: str
    connection: ConnectionInfo
    pid: int | None = None
    state: str = "starting"
    raft_address: str | None = None

    def update(self, model: dict[str, Any]) -> None:
        """Take what the host reports; a replica still catching up stays so until it is dead."""
        self.pid = model.get("pid", self.pid)
        state = model.get("state", self.state)
        if self.state != "catching-up" or state == "dead":
            self.state = state

    def fleet_model(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host_id, "pid": self.pid, "state": self.state}

    def to_state(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host_id": self.host_id,
            "connection": asdict(self.connection),
            "pid": self.pid,
            "state": self.state,
            "raft_address": self.raft_address,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ReplicaRecord:
        return cls(**{**state, "connection": ConnectionInfo.from_dict(state["connection"])})


@dataclass
class KernelRecord:
    """A kernel: its replicas, its link, and what Jupyter clients see of it."""

    id: str
    name: str
    env: dict[str, str]
    launch_name: str = ""
    """The kernelspec the hosts launch: `name`, or its replicated twin."""
    replicas_wanted: int = 1
    raft_password: str = ""
    lost_replicas: list[str] = field(default_factory=list)
    """Replicas lost from the current group: a newcomer must not wait for what they owed."""
    gpus: int = 0
    replicas: list[ReplicaRecord] = field(default_factory=list)
    link: KernelLink | None = None
    lifecycle: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by restart and shutdown, so they never interleave on one kernel."""
    executor: str | None = None
    execution_state: str = "starting"
    last_activity: datetime = field(default_factory=lambda: datetime.now(UTC))

    def model(self) -> dict[str, Any]:
        """The Jupyter kernel model (REFERENCE.md §1)."""
        return {
            "id": self.id,
            "name": self.name,
            "last_activity": self.last_activity.strftime(MODEL_TIME_FORMAT),
            "execution_state": self.execution_state,
            "connections": self.link.client_count if self.link else 0,
        }

    def fleet_model(self) -> dict[str, Any]:
        running = self.link.cells.current_assignment if self.link is not None else None
        replicas = [replica.fleet_model() for replica in self.replicas]
        for model in replicas:
            if (
                running is not None
                and model["id"] == running.replica_id
                and model["state"] == "ready"
            ):
                model["state"] = "executing"
        return {
            "id": self.id,
            "name": self.name,
            "replicas": replicas,
            "executor": self.executor,
        }

    def to_state(self) -> dict[str, Any]:
        """What a restarted gateway needs to find and relink this kernel."""
        return {
            "id": self.id,
            "name": self.name,
            "env": self.env,
            "launch_name": self.launch_name,
            "replicas_wanted": self.replicas_wanted,
            "gpus": self.gpus,
            "raft_password": self.raft_password,
            "lost_replicas": self.lost_replicas,
            "executor": self.executor,
            "replicas": [replica.to_state() for replica in self.replicas],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> KernelRecord:
        replicas = [ReplicaRecord.from_state(r) for r in state.get("replicas", [])]
        return cls(**{**state, "replicas": replicas})

    @property
    def replicated(self) -> bool:
        return self.replicas_wanted > 1

    @property
    def dead(self) -> bool:
        return bool(self.replicas) and all(replica.state == "dead" for replica in self.replicas)


def gpu_need(env: dict[str, str]) -> int:
    """The kernel's default GPU count, from ``KERNEL_GPUS`` (a non-negative integer; default 0)."""
    raw = env.get("KERNEL_GPUS", "0").strip() or "0"
    if not (raw.isascii() and raw.isdigit()):  # "²" is a digit to isdigit, not to int
        raise InvalidRequest(f"KERNEL_GPUS must be a non-negative integer, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class ReplicationSettings:
    """How many replicas a kernel gets, and where their shared objects live.

    A kernelspec listed in `launch_names` runs as `replicas` replicas of its replicated twin
    (the hosts' kernelspec of that name, which also binds GPUs per cell; with one replica it
    joins no group); any other kernelspec runs as one plain replica.
    """

    replicas: int = 1
    launch_names: dict[str, str] = field(default_factory=dict)
    store_root: str = ""
    join_timeout: float = 20.0

    def plan(self, name: str) -> tuple[str, int]:
        """(the kernelspec hosts launch, the number of replicas) for kernelspec `name`."""
        if name in self.launch_names:
            return self.launch_names[name], self.replicas
        return name, 1
