"""The fleet events' JSON schemas, one per event type, for jupyter_events.

Every event has the same envelope (docs/gateway-contract.md, "Events"):
``{"seq", "time", "type", "kernel_id", "host_id", "data"}``; each type's schema fixes ``type``
and describes its ``data``. `SCHEMAS` maps each `EventType` to its schema, registered with a
jupyter_events ``EventLogger`` by `kernelfleet.gateway.events.EventBus`; `schema_id` is its
``$id``. Built in Python (not files) so that the wheel needs no data-file configuration.
"""

from __future__ import annotations

import enum
from typing import Any

VERSION = "1"


class EventType(enum.Enum):
    """What happened; the values are the ``type`` field of an event."""

    KERNEL_STARTED = "kernel-started"
    KERNEL_STOPPED = "kernel-stopped"
    KERNEL_DEGRADED = "kernel-degraded"
    """It runs on fewer live replicas than it wants (again when the reason changes)."""
    KERNEL_REPAIRED = "kernel-repaired"
    """It has every replica it wants again."""
    CELL_QUEUED = "cell-queued"
    CELL_WAITING = "cell-waiting"
    CELL_STARTED = "cell-started"
    CELL_FINISHED = "cell-finished"
    GPUS_COMMITTED = "gpus-committed"
    GPUS_RELEASED = "gpus-released"
    REPLICA_LOST = "replica-lost"
    REPLICA_REPLACED = "replica-replaced"
    REPLICA_MIGRATED = "replica-migrated"
    HOST_ADDED = "host-added"
    HOST_DRAINING = "host-draining"
    HOST_DRAINED = "host-drained"
    HOST_LOST = "host-lost"
    AUTOSCALER_DECISION = "autoscaler-decision"
    EVENTS_MISSED = "events-missed"
    """Sent only to a subscriber that fell behind: how many events it did not get."""


_STR: dict[str, Any] = {"type": "string"}
_NSTR: dict[str, Any] = {"type": ["string", "null"]}
_INT: dict[str, Any] = {"type": "integer", "minimum": 0}
_NINT: dict[str, Any] = {"type": ["integer", "null"], "minimum": 0}
_SECONDS: dict[str, Any] = {"type": "number", "minimum": 0}
_NSECONDS: dict[str, Any] = {"type": ["number", "null"], "minimum": 0}
_STRS: dict[str, Any] = {"type": "array", "items": _STR}


def _data(description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


_MOVE: dict[str, dict[str, Any]] = {
    "replica_id": {**_STR, "description": "The new replica."},
    "replaced": {**_STR, "description": "The replica it took the place of."},
    "from_host": _NSTR,
    "to_host": _STR,
}

DATA: dict[EventType, dict[str, Any]] = {
    EventType.KERNEL_STARTED: _data(
        "A kernel started and answered.",
        name={**_STR, "description": "Its kernelspec."},
        replicas={
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": _STR, "host": _STR},
                "required": ["id", "host"],
                "additionalProperties": False,
            },
        },
        gpus={**_INT, "description": "Its default GPU count per cell."},
        notebook_path=_NSTR,
        user=_NSTR,
    ),
    EventType.KERNEL_STOPPED: _data("A kernel was shut down.", why=_STR),
    EventType.KERNEL_DEGRADED: _data(
        "A kernel runs on fewer live replicas than it wants (sent again when why changes).",
        reason={**_STR, "description": "The true cause, and what its replacement waits for."},
        live_replicas=_INT,
        wanted_replicas=_INT,
    ),
    EventType.KERNEL_REPAIRED: _data("A degraded kernel has every replica it wants again."),
    EventType.CELL_QUEUED: _data(
        "The gateway received a cell.",
        cell_id=_STR,
        gpus={**_NINT, "description": "What the cell asked for; null: the kernel's default."},
        queued={**_INT, "description": "The kernel's cells not yet started, this one included."},
    ),
    EventType.CELL_WAITING: _data(
        "A cell waits for GPUs (again when why or its place in line changes).",
        cell_id=_STR,
        gpus=_INT,
        reason={**_STR, "description": "What it waits for: GPUs to be released, hosts..."},
        cells_ahead=_INT,
        text={**_STR, "description": "What the cell's output shows."},
    ),
    EventType.CELL_STARTED: _data(
        "A replica began a cell.",
        cell_id=_STR,
        replica_id=_STR,
        gpus=_INT,
        devices=_STRS,
        start_delay_s={**_SECONDS, "description": "From the gateway receiving it to this."},
        waited={**_NSTR, "description": "Why it waited, for a person; null if it did not."},
        moved_to={**_NSTR, "description": "The host a replica moved to for it, if one did."},
    ),
    EventType.CELL_FINISHED: _data(
        "A cell ended (or was answered without running).",
        cell_id=_STR,
        outcome={
            **_STR,
            "enum": ["ok", "error", "aborted", "idle", "lost"],
            "description": "The execute_reply status, or how else it ended.",
        },
        duration_s={**_NSECONDS, "description": "Since it started; null if it never did."},
    ),
    EventType.GPUS_COMMITTED: _data(
        "Devices bound to a cell (or, `cell_id` `session`, to a kernel for its life).",
        devices=_STRS,
        cell_id=_STR,
        replica_id=_STR,
    ),
    EventType.GPUS_RELEASED: _data(
        "Devices a cell held are free again.", devices=_STRS, cell_id=_STR, replica_id=_STR
    ),
    EventType.REPLICA_LOST: _data("A replica died.", replica_id=_STR, why=_STR),
    EventType.REPLICA_REPLACED: _data("A lost replica was replaced.", **_MOVE),
    EventType.REPLICA_MIGRATED: _data("A live replica moved, its state kept.", **_MOVE),
    EventType.HOST_ADDED: _data(
        "A host registered, or came back after missing its heartbeats (`returned`).",
        address=_STR,
        gpus=_INT,
        returned={"type": "boolean"},
    ),
    EventType.HOST_DRAINING: _data(
        "A host takes no new work; its replicas are moving away.", replicas=_INT
    ),
    EventType.HOST_DRAINED: _data("Every replica moved off a host.", moved=_INT),
    EventType.HOST_LOST: _data("A host stopped heartbeating, or was stopped on purpose.", why=_STR),
    EventType.AUTOSCALER_DECISION: _data(
        "An autoscaling round that did not hold.",
        action={**_STR, "enum": ["scale-out", "scale-in"]},
        reason={**_STR, "description": "Why it acted, or why it did not (yet)."},
        decision={**_STR, "description": "The policy's decision: `add 1 host(s)`..."},
        started=_STRS,
        stopped=_STRS,
    ),
    EventType.EVENTS_MISSED: _data(
        "This subscriber fell behind and did not get these events.",
        missed={**_INT, "description": "How many."},
        first_seq=_INT,
        last_seq=_INT,
    ),
}


def schema_id(event_type: EventType) -> str:
    return f"urn:kernelfleet:events:{event_type.value}:v{VERSION}"


def _schema(event_type: EventType) -> dict[str, Any]:
    return {
        "$id": schema_id(event_type),
        "version": VERSION,
        "title": f"kernelfleet {event_type.value}",
        "description": DATA[event_type]["description"],
        "type": "object",
        "properties": {
            "seq": {**_INT, "description": "Monotonic per gateway run."},
            "time": {"type": "number", "description": "Unix seconds."},
            "type": {"type": "string", "const": event_type.value},
            "kernel_id": _NSTR,
            "host_id": _NSTR,
            "data": DATA[event_type],
        },
        "required": ["seq", "time", "type", "kernel_id", "host_id", "data"],
        "additionalProperties": False,
    }


SCHEMAS: dict[EventType, dict[str, Any]] = {
    event_type: _schema(event_type) for event_type in EventType
}
