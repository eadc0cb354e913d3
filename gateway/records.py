"""The gateway's records of kernels and their replicas, and how kernels replicate.

Plain data with the conversions the APIs and the store need, and a replica's state machine
(`ReplicaState`); the behaviour is in ``kernel_service`` and the collaborators it wires.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.channels import KernelLink
from kernelfleet.protocol import ConnectionInfo
from kernelfleet.states import Transitions, check_transition

log = logging.getLogger("kernelfleet.gateway.records")

MODEL_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # jupyter_server needs the microseconds and the Z


class ReplicaState(enum.Enum):
    """A replica as the gateway sees it. The values are what the admin API shows.

    The host agent reports ``starting``, ``ready``, ``restarting``, ``dead`` and ``stopped``
    (its own `ReplicaState`); the gateway adds ``catching-up``: a replica that joined its
    kernel's group late and replays the log until it is ``ready``.
    """

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    CATCHING_UP = "catching-up"
    DEAD = "dead"
    STOPPED = "stopped"


_R = ReplicaState
REPLICA_TRANSITIONS: Transitions[ReplicaState] = {
    # A host report may skip states the agent went through between two heartbeats: the
    # agent's moves (starting -> ready <-> restarting, any -> dead, dead -> restarting) and
    # their shortcuts. A restart brings a dead replica back.
    _R.STARTING: frozenset({_R.READY, _R.RESTARTING, _R.DEAD, _R.STOPPED}),
    _R.READY: frozenset({_R.RESTARTING, _R.DEAD, _R.STOPPED}),
    _R.RESTARTING: frozenset({_R.READY, _R.DEAD, _R.STOPPED}),
    _R.CATCHING_UP: frozenset({_R.READY, _R.DEAD}),
    _R.DEAD: frozenset({_R.RESTARTING, _R.READY, _R.STOPPED}),
    _R.STOPPED: frozenset({_R.DEAD}),  # its host was lost: the gateway counts it dead
}


@dataclass
class ReplicaRecord:
    """One process of a kernel, on one host.

    `state` moves only through `move_to` (the gateway's own decisions: a replica lost with its
    host is ``dead``, a newcomer that caught up is ``ready``) and `update` (what its host
    reports). A replica created to join a running group starts as ``catching-up``.
    """

    id: str
    host_id: str
    connection: ConnectionInfo
    pid: int | None = None
    state: ReplicaState = ReplicaState.STARTING
    raft_address: str | None = None

    def move_to(self, state: ReplicaState) -> None:
        """Go to `state`; `IllegalTransition` (naming this replica) if its table forbids it."""
        self.state = check_transition(REPLICA_TRANSITIONS, f"replica {self.id}", self.state, state)

    @property
    def dead(self) -> bool:
        return self.state is ReplicaState.DEAD

    def update(self, model: dict[str, Any]) -> None:
        """Take what the host reports; a replica still catching up stays so until it is dead.

        A report is a fact from another process, possibly late: a state the table does not
        lead to from here (an older heartbeat overtaken by a start call's answer, say) is
        logged and left for the next report, never raised."""
        self.pid = model.get("pid", self.pid)
        try:
            reported = ReplicaState(model.get("state", self.state.value))
        except ValueError:
            log.warning("replica %s: its host reports an unknown state %r", self.id, model)
            return
        if reported is self.state:
            return
        if self.state is ReplicaState.CATCHING_UP and reported is not ReplicaState.DEAD:
            return
        if reported not in REPLICA_TRANSITIONS[self.state]:
            log.info(
                "replica %s: its host reports %s, which does not follow %s: kept %s",
                self.id, reported.value, self.state.value, self.state.value,
            )  # fmt: skip
            return
        self.state = reported

    def fleet_model(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host_id, "pid": self.pid, "state": self.state.value}

    def to_state(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host_id": self.host_id,
            "connection": asdict(self.connection),
            "pid": self.pid,
            "state": self.state.value,
            "raft_address": self.raft_address,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ReplicaRecord:
        return cls(
            **{
                **state,
                "connection": ConnectionInfo.from_dict(state["connection"]),
                "state": ReplicaState(state.get("state", ReplicaState.STARTING.value)),
            }
        )


RECENT_CELLS = 10
"""Cells a kernel's admin model lists (``recent_cells``), newest last."""


@dataclass
class CellRecord:
    """One of a kernel's recent cells, as the admin API shows it (`model`). Times are unix
    seconds; `outcome` is None until it ends (a `CellOutcome` value then)."""

    id: str
    queued_at: float
    gpus: int | None = None
    host: str | None = None
    devices: tuple[str, ...] = ()
    started_at: float | None = None
    start_delay_s: float | None = None
    waited: str | None = None
    moved_to: str | None = None
    outcome: str | None = None
    duration_s: float | None = None

    def model(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices)}


def _no_gpus_held() -> list[dict[str, Any]]:
    return []


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
    notebook_path: str | None = None
    """The notebook's path, if the Jupyter server sent it (`start_facts`)."""
    user: str | None = None
    """Who started it, if the Jupyter server said (`start_facts`)."""
    recent_cells: deque[CellRecord] = field(default_factory=lambda: deque(maxlen=RECENT_CELLS))
    gpus_held: Callable[[], list[dict[str, Any]]] = _no_gpus_held
    """``[{"host", "devices"}]`` bound to it right now; the kernel service sets it (the ledger
    knows)."""
    degraded_since: float | None = None
    """Unix seconds since it runs on fewer live replicas than it wants; None: it has them all.
    Set and cleared by the `GroupKeeper` only (`degrade`, `repaired`), while it repairs the
    kernel (not stored: a restarted gateway judges the replicas afresh)."""
    degraded_reason: str = ""
    """Why it is degraded, for a person: the true cause and what the repair waits for."""
    started_from_pool: bool = False
    """Its replicas were a warm pool's group, started before its start asked
    (`kernelfleet.gateway.kernel_pool`); False: launched for it (or a previous gateway's)."""

    def degrade(self, reason: str, now: float) -> bool:
        """Note that it misses a replica, for `reason` (the latest cause replaces an older
        one); True when it was whole until now."""
        first = self.degraded_since is None
        if first:
            self.degraded_since = now
        self.degraded_reason = reason
        return first

    def repaired(self) -> bool:
        """It has every replica again; True when it was degraded until now."""
        was = self.degraded_since is not None
        self.degraded_since, self.degraded_reason = None, ""
        return was

    def degraded(self) -> dict[str, Any] | None:
        """The model's ``degraded``: None while whole, else ``{"since", "reason",
        "live_replicas", "wanted_replicas"}`` (live: neither dead nor still catching up)."""
        if self.degraded_since is None:
            return None
        return {
            "since": self.degraded_since,
            "reason": self.degraded_reason,
            "live_replicas": len(self.linkable_replicas()),
            "wanted_replicas": self.replicas_wanted,
        }

    def model(self) -> dict[str, Any]:
        """The Jupyter kernel model (docs/gateway-contract.md)."""
        return {
            "id": self.id,
            "name": self.name,
            "last_activity": self.last_activity.strftime(MODEL_TIME_FORMAT),
            "execution_state": self.execution_state,
            "connections": self.link.client_count if self.link else 0,
            "degraded": self.degraded(),
        }

    def fleet_model(self) -> dict[str, Any]:
        running = self.link.cells.current_assignment if self.link is not None else None
        replicas = [replica.fleet_model() for replica in self.replicas]
        for model in replicas:
            if (
                running is not None
                and model["id"] == running.replica_id
                and model["state"] == ReplicaState.READY.value
            ):
                model["state"] = "executing"  # shown only: the replica runs the kernel's cell
        return {
            "id": self.id,
            "name": self.name,
            "replicas": replicas,
            "executor": self.executor,
            "gpus": self.gpus,
            "gpus_held": self.gpus_held(),
            "queued_cells": self.link.cells.queued if self.link is not None else 0,
            "last_activity": self.last_activity.timestamp(),
            "notebook_path": self.notebook_path,
            "user": self.user,
            "recent_cells": [cell.model() for cell in self.recent_cells],
            "waiting": self.waiting_for(),
            "degraded": self.degraded(),
            "started_from_pool": self.started_from_pool,
        }

    def waiting_for(self) -> dict[str, Any] | None:
        """Why its next cell waits for GPUs (`Cell.waiting_for`), or None when none waits."""
        current = self.link.cells.current if self.link is not None else None
        if current is None or current.started.done():
            return None
        return current.waiting_for

    def recent_cell(self, cell_id: str) -> CellRecord | None:
        """The record of cell `cell_id` among the recent ones (newest first), or None."""
        return next((cell for cell in reversed(self.recent_cells) if cell.id == cell_id), None)

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
            "notebook_path": self.notebook_path,
            "user": self.user,
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
        return bool(self.replicas) and all(replica.dead for replica in self.replicas)

    def live_replicas(self) -> list[ReplicaRecord]:
        """Its replicas that are not dead (catching-up ones included)."""
        return [replica for replica in self.replicas if not replica.dead]

    def linkable_replicas(self) -> list[ReplicaRecord]:
        """Its replicas that can answer clients: neither dead nor still catching up."""
        return [
            replica
            for replica in self.replicas
            if replica.state not in (ReplicaState.DEAD, ReplicaState.CATCHING_UP)
        ]


NOTEBOOK_PATH_VARIABLE = "JPY_SESSION_NAME"
"""The notebook's path, which jupyter_server puts in a kernel's start ``env`` (it reaches the
gateway when the Jupyter server's ``GatewayClient.allowed_envs`` names it)."""

WORKING_DIR_VARIABLE = "KERNEL_WORKING_DIR"
"""The notebook's folder, which jupyter_server's gateway client always sends."""

USER_VARIABLE = "KERNEL_USERNAME"
"""The user, which jupyter_server's gateway client sends (its ``GatewayClient.http_user`` if
the variable is not set)."""


def start_facts(env: Any) -> tuple[str | None, str | None]:
    """(notebook path, user) from a kernel-create request's ``env``, before it is filtered:
    the notebook's own path when sent, else its folder; None for what is not there."""
    if not isinstance(env, dict):
        return None, None

    def text(name: str) -> str | None:
        value = env.get(name)
        return value if isinstance(value, str) and value else None

    return text(NOTEBOOK_PATH_VARIABLE) or text(WORKING_DIR_VARIABLE), text(USER_VARIABLE)


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
    container_launches: frozenset[str] = frozenset()
    """The launched kernelspecs that run in containers: only hosts whose agent reaches a
    container engine take their replicas (`FleetView`)."""
    store_root: str = ""
    join_timeout: float = 20.0

    def plan(self, name: str) -> tuple[str, int]:
        """(the kernelspec hosts launch, the number of replicas) for kernelspec `name`."""
        if name in self.launch_names:
            return self.launch_names[name], self.replicas
        return name, 1
