"""The admin API's OpenAPI 3 description: the one source of truth for ``/api/fleet/*``.

Written by hand from the handlers in `kernelfleet.gateway.handlers.fleet` and kept true by
tests/gateway/test_openapi.py, which checks every ``/api/fleet`` route against it and validates
live responses (and a schemathesis run) against its schemas. ``GET /api/fleet/openapi.json``
serves `spec`, with ``servers`` naming the gateway that answered. The Jupyter gateway endpoints
(``/api/kernels``, ``/api/kernelspecs``) are jupyter_server's contract and are not described.
"""

from __future__ import annotations

import copy
from typing import Any

from kernelfleet import __version__
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.gpu_speeds import (
    FINGERPRINT_INTEGERS,
    FINGERPRINT_NUMBERS,
    FINGERPRINT_SOURCES,
)
from kernelfleet.gateway.hosts import ISOLATION_KERNEL_USERS
from kernelfleet.gateway.openapi_builders import (
    INT,
    STRINGS,
    closed_object,
    error_response,
    json_response,
    ref,
)
from kernelfleet.gateway.openapi_gpu_settings import gpu_settings_paths, gpu_settings_schemas
from kernelfleet.gateway.openapi_jobs import job_paths, job_schemas
from kernelfleet.gateway.openapi_tool_workers import tool_worker_paths, tool_worker_schemas

_NULLABLE_STRING = {"type": "string", "nullable": True}
_SECONDS = {"type": "number", "minimum": 0}
_ID = "^[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
"""Host and replica ids as the routes take them (``[\\w.-]+``), less a leading dot, so that no
generated id reads as a ``.``/``..`` path segment."""


def _gpu_fingerprint_schema() -> dict[str, Any]:
    """One GPU's fingerprint (`kernelfleet.kernels.agent.fingerprint.GpuFingerprint`)."""
    figures = {
        **{name: {**_SECONDS, "nullable": True} for name in FINGERPRINT_NUMBERS},
        **{name: {**INT, "nullable": True} for name in FINGERPRINT_INTEGERS},
    }
    return {
        **closed_object(
            {
                "source": {"type": "string", "enum": list(FINGERPRINT_SOURCES)},
                **figures,
                "notes": STRINGS,
            }
        ),
        "description": "How fast a GPU is, as its agent found at start: `measured` (matmul "
        "TFLOPS fp16/fp32 and device copy GB/s through torch; clocks in MHz and power in W "
        "through NVML), `configured` (a virtual GPU: `speed_factor`) or `unmeasured` (`notes` "
        "says why). A figure that could not be read is null.",
    }


_AUTH_ERRORS = {
    "401": error_response(
        "No token presented, or a kernel token that is forged or whose kernel is gone "
        "(`reason`: `unauthorized`)."
    ),
    "403": error_response(
        "The token is not valid, or it is a kernel token this operation does not take "
        "(`reason`: `forbidden`)."
    ),
}


def _path_param(name: str, pattern: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": pattern, "minLength": 1},
    }


_KERNEL_FILTER = {
    "name": "kernel",
    "in": "query",
    "required": False,
    "description": "Only this kernel's events (404 if the gateway runs no such kernel).",
    "schema": {"type": "string"},
}

_HOST_ID = _path_param("host_id", _ID, "A host's id (`host-1`, ...).")
_KERNEL_ID = _path_param("kernel_id", "^[A-Za-z0-9_-]+$", "A kernel's id.")
_REPLICA_ID = _path_param("replica_id", _ID, "One of the kernel's replicas' ids.")

_ISOLATION = closed_object(
    {
        "kernel_user": {
            "type": "string",
            "enum": list(ISOLATION_KERNEL_USERS),
            "description": "`per-kernel`: each kernel runs as a user of its own; `agent`: "
            "kernels run as the agent's user.",
        },
        "why": {"type": "string", "description": "Why, for a person."},
    }
)
"""A host's ``isolation``, as its agent reports it (``GET /api/host`` of the agent)."""

_CONTAINERS = {
    **closed_object(
        {
            "engine": {"type": "string", "description": "The Docker Engine API it uses."},
            "reachable": {"type": "boolean"},
            "why": {
                "type": "string",
                "nullable": True,
                "description": "Why it cannot be reached (null when it can).",
            },
        }
    ),
    "nullable": True,
    "description": "Its container engine (docs/containers.md); null: it runs no containers. "
    "Container kernels are placed only on hosts that reach theirs.",
}

_SCHEMAS: dict[str, Any] = {
    "Error": closed_object(
        {
            "reason": {"type": "string", "description": "A short, stable code: `not-found`..."},
            "message": {"type": "string", "description": "What went wrong, for a person."},
        }
    ),
    "Fleet": closed_object(
        {
            "version": {"type": "string", "description": "The gateway's kernelfleet version."},
            "policy": {"type": "string", "description": "The scheduling policy (`--policy`)."},
            "replicas": {
                "type": "integer",
                "minimum": 1,
                "description": "Replicas per replicated kernel (`--replicas`).",
            },
            "hosts": closed_object({"alive": INT, "lost": INT}),
            "gpus": {
                **closed_object({"total": INT, "subscribed": INT, "committed": INT}),
                "description": "The alive hosts' GPUs, summed.",
            },
            "kernels": INT,
            "jobs": ref("JobsSummary"),
            "autoscaling": {
                **closed_object(
                    {
                        "min_hosts": INT,
                        "max_hosts": {**INT, "description": "0: no limit."},
                        "gpus_per_host": INT,
                        "hosts_started": STRINGS,
                        "last_round": {
                            **closed_object(
                                {
                                    "decision": {"type": "string"},
                                    "started": STRINGS,
                                    "stopped": STRINGS,
                                    "skipped": {
                                        "type": "array",
                                        "items": closed_object(
                                            {
                                                "subject": {"type": "string"},
                                                "why": {"type": "string"},
                                            }
                                        ),
                                    },
                                }
                            ),
                            "nullable": True,
                            "description": "The latest round that did not hold; null before one.",
                        },
                        "demand_model": {
                            **closed_object(
                                {
                                    "file": {"type": "string"},
                                    "horizon_s": _SECONDS,
                                    "step_s": _SECONDS,
                                    "margin_gpus": {"type": "number", "minimum": 0},
                                    "quantile": {"type": "number", "minimum": 0},
                                    "trained": {
                                        "type": "object",
                                        "description": "The training span: trace, from_s, "
                                        "until_s, steps.",
                                    },
                                    "predicted_gpus": {"type": "number", "nullable": True},
                                }
                            ),
                            "nullable": True,
                            "description": "The demand model the autoscaler follows "
                            "(docs/economics.md); null when it follows demand as it is.",
                        },
                    }
                ),
                "nullable": True,
                "description": "The autoscaler; null when it does not run.",
            },
        }
    ),
    "Host": closed_object(
        {
            "id": {"type": "string"},
            "address": {"type": "string", "description": "The host agent's http(s) URL."},
            "state": {"type": "string", "enum": ["alive", "lost"]},
            "kind": {
                "type": "string",
                "enum": ["on-demand", "spot"],
                "description": "spot: revocable; a majority of every kernel's replicas stays "
                "on on-demand hosts.",
            },
            "gpus": closed_object(
                {
                    "total": INT,
                    "subscribed": INT,
                    "committed": {**INT, "description": "Never more than `total`."},
                    "vanished": {
                        **STRINGS,
                        "description": "Devices no longer reported that running cells hold.",
                    },
                    "over_committed": {"type": "boolean"},
                    "type": {"type": "string", "description": "The GPU type it advertises."},
                    "devices": {
                        "type": "array",
                        "items": closed_object(
                            {
                                "id": {"type": "string"},
                                "lent_to_job": _NULLABLE_STRING,
                                "held_for_workers": {
                                    **closed_object(
                                        {
                                            "kernel_id": {"type": "string"},
                                            "group_id": {"type": "string"},
                                        }
                                    ),
                                    "nullable": True,
                                },
                                "relative_speed": {"type": "number", "minimum": 0},
                                "fingerprint": {**ref("GpuFingerprint"), "nullable": True},
                            }
                        ),
                        "description": "Its devices; `lent_to_job`: the job it is lent to; "
                        "`held_for_workers`: the kernel and group of tool workers it is held "
                        "for (`/api/fleet/kernels/{id}/workers`); "
                        "`relative_speed`: its speed against the median GPU of its type in the "
                        "fleet (a virtual GPU's configured factor; 1.0 when unknown); "
                        "`fingerprint`: what its agent measured at start (null: nothing).",
                    },
                }
            ),
            "isolation": {
                **_ISOLATION,
                "nullable": True,
                "description": "Which user its kernels run as, as its agent last reported; "
                "null when the agent did not say.",
            },
            "drain": {
                **closed_object(
                    {
                        "state": {"type": "string", "enum": ["moving", "drained", "failed"]},
                        "why": {"type": "string"},
                        "replicas": {"type": "integer", "minimum": 0},
                        "left": {"type": "integer", "minimum": 0},
                        "error": {"type": "string", "nullable": True},
                    }
                ),
                "nullable": True,
                "description": "An operator's drain (`POST .../drain`): `moving` its replicas "
                "away, `drained` (none is `left`: its agent may be stopped) or `failed` (a "
                "move failed, `error` says why: the host takes work again); `replicas`: how "
                "many it had to move. Null: none, or the host takes work again.",
            },
            "containers": _CONTAINERS,
        }
    ),
    "GpuFingerprint": _gpu_fingerprint_schema(),
    "HostReport": {
        **closed_object(
            {
                "address": {"type": "string", "pattern": "^https?://"},
                "id": {"type": "string", "description": "If given, the path's host id."},
                "instance": {"type": "string", "description": "The agent process's identity."},
                "gpus": {"type": "array", "items": {"type": "object"}},
                "replicas": {"type": "array", "items": {"type": "object"}},
                "isolation": {**_ISOLATION, "nullable": True},
                "gpu_type": {"type": "string", "minLength": 1},
                "kind": {
                    "type": "string",
                    "enum": ["on-demand", "spot"],
                    "description": "spot: revocable (docs/economics.md, 'Transient hosts').",
                },
                "jobs": {"type": "array", "items": {"type": "object"}},
                "workers": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "The tool workers the agent runs or saw exit.",
                },
                "containers": _CONTAINERS,
            },
            optional=(
                "id",
                "instance",
                "gpus",
                "replicas",
                "isolation",
                "gpu_type",
                "kind",
                "jobs",
                "workers",
                "containers",
            ),
        ),
        "additionalProperties": True,
    },
    "HostAck": closed_object(
        {"id": {"type": "string"}, "state": {"type": "string", "enum": ["alive"]}}
    ),
    "Replica": closed_object(
        {
            "id": {"type": "string"},
            "host": {"type": "string"},
            "pid": {"type": "integer", "nullable": True},
            "state": {
                "type": "string",
                "enum": [
                    "starting",
                    "ready",
                    "executing",
                    "restarting",
                    "catching-up",
                    "dead",
                    "stopped",
                ],
            },
        }
    ),
    "Kernel": closed_object(
        {
            "id": {"type": "string"},
            "name": {"type": "string", "description": "Its kernelspec."},
            "replicas": {"type": "array", "items": ref("Replica")},
            "executor": {
                "type": "string",
                "nullable": True,
                "description": "The replica that runs its cells; null when none was chosen yet.",
            },
            "gpus": {
                **INT,
                "description": "GPUs per cell unless a cell asks otherwise (`%%gpus N`, metadata).",
            },
            "gpus_held": {
                "type": "array",
                "items": closed_object({"host": {"type": "string"}, "devices": STRINGS}),
                "description": "Devices bound to it right now, by host.",
            },
            "queued_cells": {**INT, "description": "Its cells in the gateway, not begun yet."},
            "last_activity": {
                "type": "number",
                "nullable": True,
                "description": "Unix seconds of its last message.",
            },
            "notebook_path": {
                **_NULLABLE_STRING,
                "description": "The notebook's path (or folder) as its Jupyter server sent it.",
            },
            "user": {**_NULLABLE_STRING, "description": "`KERNEL_USERNAME` as sent at start."},
            "waiting": {
                **closed_object(
                    {
                        "cell_id": {"type": "string"},
                        "gpus": INT,
                        "reason": {"type": "string"},
                        "cells_ahead": INT,
                        "text": {"type": "string", "description": "For a person."},
                    }
                ),
                "nullable": True,
                "description": "Why its next cell waits for GPUs now (as the latest "
                "`cell-waiting` event said); null when no cell waits.",
            },
            "recent_cells": {
                "type": "array",
                "items": ref("RecentCell"),
                "description": "Its last 10 cells, newest last.",
            },
            "degraded": {
                **closed_object(
                    {
                        "since": {**_SECONDS, "description": "Unix seconds since it misses one."},
                        "reason": {
                            "type": "string",
                            "description": "The true cause, and what the replacement waits for.",
                        },
                        "live_replicas": {**INT, "description": "Replicas that answer now."},
                        "wanted_replicas": {**INT, "description": "Its replicas when whole."},
                    }
                ),
                "nullable": True,
                "description": "Null while it has every live replica it wants.",
            },
            "started_from_pool": {
                "type": "boolean",
                "description": "Whether its replicas came from the warm pool "
                "(`GatewayApp.kernel_pool_size`) rather than being launched for it.",
            },
        }
    ),
    "RecentCell": closed_object(
        {
            "id": {"type": "string", "description": "The execute_request's msg_id."},
            "host": {**_NULLABLE_STRING, "description": "Where it ran; null until assigned."},
            "gpus": {**INT, "nullable": True},
            "devices": STRINGS,
            "queued_at": {"type": "number", "description": "Unix seconds."},
            "started_at": {"type": "number", "nullable": True},
            "start_delay_s": {**_SECONDS, "nullable": True},
            "waited": {**_NULLABLE_STRING, "description": "Why it waited, for a person."},
            "moved_to": _NULLABLE_STRING,
            "outcome": {**_NULLABLE_STRING, "description": "null while it has not ended."},
            "duration_s": {**_SECONDS, "nullable": True},
        }
    ),
    "Event": closed_object(
        {
            "seq": {**INT, "description": "Monotonic per gateway run."},
            "time": {"type": "number", "description": "Unix seconds."},
            "type": {"type": "string", "enum": [t.value for t in EventType]},
            "kernel_id": _NULLABLE_STRING,
            "host_id": _NULLABLE_STRING,
            "data": {
                "type": "object",
                "description": "Type-specific (docs/gateway-contract.md, Events).",
            },
        }
    ),
    "KernelMigration": closed_object(
        {
            "state": {
                "type": "string",
                "enum": ["done", "scheduled"],
                "description": "`scheduled`: a cell of the kernel runs or waits; the replica "
                "moves once it ends (a `replica-migrated` event tells).",
            },
            "replica_id": {
                **_NULLABLE_STRING,
                "description": "The moved replica's successor; null while scheduled.",
            },
            "from_host": {"type": "string"},
            "to_host": {
                **_NULLABLE_STRING,
                "description": "null while scheduled with no host named (the policy picks).",
            },
        }
    ),
    "GpuSetting": {
        **closed_object({"gpus": {"type": "integer"}}),
        "description": "`gpus`: a non-negative integer, at most the largest host's GPUs.",
    },
    "Migration": closed_object(
        {"host": {"type": "string", "description": "Where to; left out: the policy chooses."}},
        optional=("host",),
    ),
}

_PATHS: dict[str, Any] = {
    "/api/fleet": {
        "get": {
            "operationId": "getFleet",
            "summary": "What the gateway runs and a summary of the fleet.",
            "responses": {"200": json_response(ref("Fleet"), "The fleet."), **_AUTH_ERRORS},
        }
    },
    "/api/fleet/openapi.json": {
        "get": {
            "operationId": "getOpenApi",
            "summary": "This description, `servers` naming the gateway that served it.",
            "responses": {"200": json_response({"type": "object"}, "OpenAPI 3."), **_AUTH_ERRORS},
        }
    },
    "/api/fleet/serving": {
        "get": {
            "operationId": "getServing",
            "summary": "Whether this gateway serves: a lone gateway always does; in a replicated "
            "group, the member that leads (a standby answers 503 `not-serving`, naming the one "
            "that serves). What `kernelfleet gateway-proxy` probes.",
            "responses": {
                "200": json_response(
                    {
                        "type": "object",
                        "required": ["serving", "term", "member"],
                        "properties": {
                            "serving": {"type": "boolean", "enum": [True]},
                            "term": {
                                "type": "integer",
                                "minimum": 0,
                                "description": "The group's Raft term it serves in (0: a "
                                "lone gateway).",
                            },
                            "member": {"type": "string", "description": "Its own URL."},
                        },
                    },
                    "This gateway serves.",
                ),
                **_AUTH_ERRORS,
            },
        }
    },
    "/api/fleet/hosts": {
        "get": {
            "operationId": "listHosts",
            "summary": "Every host the gateway knows.",
            "responses": {
                "200": json_response({"type": "array", "items": ref("Host")}, "The hosts."),
                **_AUTH_ERRORS,
            },
        }
    },
    "/api/fleet/hosts/{host_id}": {
        "parameters": [_HOST_ID],
        "get": {
            "operationId": "getHost",
            "summary": "One host.",
            "responses": {
                "200": json_response(ref("Host"), "The host."),
                "404": error_response("No such host."),
                **_AUTH_ERRORS,
            },
        },
        "put": {
            "operationId": "reportHost",
            "summary": "A host agent's registration and heartbeat (one idempotent call).",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("HostReport")}},
            },
            "responses": {
                "200": json_response(ref("HostAck"), "Recorded; the host is alive."),
                "400": error_response("Not a valid report."),
                **_AUTH_ERRORS,
                "401": error_response(
                    "No token, or not the fleet token: a host agent with a wrong token is "
                    "refused, and the gateway logs it once per agent (`reason`: `unauthorized`)."
                ),
                "409": error_response(
                    "Another live agent (another instance, at another address) is this host: "
                    "the message names the host and that agent's address (`reason`: "
                    "`host-id-taken`)."
                ),
            },
        },
    },
    "/api/fleet/hosts/{host_id}/drain": {
        "parameters": [_HOST_ID],
        "post": {
            "operationId": "drainHost",
            "summary": "Close a host to new work and move its replicas away, state kept, in "
            "the background (before maintenance, or on a spot host's revocation notice); the "
            "host's `drain` follows it. A drain under way is answered as it is.",
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": closed_object(
                            {"why": {"type": "string", "minLength": 1}}, optional=("why",)
                        )
                    }
                },
            },
            "responses": {
                "202": json_response(ref("Host"), "Closed; its replicas are being moved."),
                "400": error_response("Not a valid body."),
                "404": error_response("No such host."),
                "409": error_response(
                    "Nothing moved: the host is not alive, runs a single-replica kernel "
                    "(which cannot move without losing its state), or is starting a replica; "
                    "the message says which."
                ),
                **_AUTH_ERRORS,
            },
        },
        "delete": {
            "operationId": "reopenHost",
            "summary": "A drained host (or one whose drain failed) takes work again.",
            "responses": {
                "200": json_response(ref("Host"), "It takes work again."),
                "404": error_response("No such host."),
                "409": error_response("It is not draining, or its drain still moves replicas."),
                **_AUTH_ERRORS,
            },
        },
    },
    "/api/fleet/hosts/{host_id}/link": {
        "parameters": [_HOST_ID],
        "get": {
            "operationId": "linkHost",
            "summary": "A websocket a registered host agent keeps open: the gateway pings it, "
            "and takes the host for lost the moment it closes or stops answering.",
            "parameters": [
                {
                    "name": "instance",
                    "in": "query",
                    "required": True,
                    "description": "The agent's instance, as its heartbeats report it.",
                    "schema": {"type": "string"},
                }
            ],
            "responses": {
                "101": {"description": "Switching to the websocket protocol."},
                "400": error_response("Not a websocket request."),
                "404": error_response("No such host: it has not registered (yet)."),
                "409": error_response(
                    "Another agent is this host now (`reason`: `host-id-taken`)."
                ),
                **_AUTH_ERRORS,
            },
        },
    },
    "/api/fleet/events": {
        "get": {
            "operationId": "listEvents",
            "summary": "The last fleet events the gateway keeps, oldest first.",
            "parameters": [
                _KERNEL_FILTER,
                {
                    "name": "n",
                    "in": "query",
                    "required": False,
                    "description": "How many (default 50).",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                },
            ],
            "responses": {
                "200": json_response({"type": "array", "items": ref("Event")}, "The events."),
                "400": error_response("`n` is not an integer from 1 to 1000."),
                "404": error_response("No such kernel."),
                **_AUTH_ERRORS,
            },
        }
    },
    "/api/fleet/events/stream": {
        "get": {
            "operationId": "streamEvents",
            "summary": "A websocket: each event as one JSON text message (an `Event`), first "
            "those kept after `since`, then live ones. A client that falls behind gets an "
            "`events-missed` event for what it lost.",
            "parameters": [
                _KERNEL_FILTER,
                {
                    "name": "since",
                    "in": "query",
                    "required": False,
                    "description": "Send the kept events numbered after this first.",
                    "schema": {"type": "integer", "minimum": 0},
                },
            ],
            "responses": {
                "101": {"description": "Switching to the websocket protocol."},
                "400": error_response("Not a websocket request, or `since` is not a number."),
                "404": error_response("No such kernel."),
                **_AUTH_ERRORS,
            },
        }
    },
    "/api/fleet/kernels": {
        "get": {
            "operationId": "listKernels",
            "summary": "Every kernel and its replicas.",
            "responses": {
                "200": json_response({"type": "array", "items": ref("Kernel")}, "The kernels."),
                **_AUTH_ERRORS,
            },
        }
    },
    "/api/fleet/kernels/{kernel_id}": {
        "parameters": [_KERNEL_ID],
        "get": {
            "operationId": "getKernel",
            "summary": "One kernel and its replicas.",
            "responses": {
                "200": json_response(ref("Kernel"), "The kernel."),
                "404": error_response("No such kernel."),
                **_AUTH_ERRORS,
            },
        },
    },
    "/api/fleet/kernels/{kernel_id}/migrate": {
        "parameters": [_KERNEL_ID],
        "post": {
            "operationId": "migrateKernel",
            "summary": (
                "Move the kernel's executor replica (the one that ran its last cell, else its "
                "first) to `host`, or where the policy places it. A kernel's own token may."
            ),
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": ref("Migration")}},
            },
            "responses": {
                "200": json_response(ref("KernelMigration"), "Moved."),
                "202": json_response(
                    ref("KernelMigration"), "Checked; moves once the running cell ends."
                ),
                "400": error_response("Not a valid body."),
                "404": error_response("No such kernel or host (the message names it)."),
                "409": error_response(
                    "It cannot move: the kernel has a single replica, the replica is not ready "
                    "or is on that host already, or the host is lost or holds another replica."
                ),
                "500": error_response("The new replica failed to start (`kernel-start-failed`)."),
                "502": error_response("A host agent did not answer."),
                "503": error_response("No host can take the new replica."),
                **_AUTH_ERRORS,
            },
        },
    },
    "/api/fleet/kernels/{kernel_id}/gpus": {
        "parameters": [_KERNEL_ID],
        "put": {
            "operationId": "setKernelGpus",
            "summary": (
                "Set the kernel's GPU count for its later cells that ask for none themselves. "
                "A kernel's own token may."
            ),
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref("GpuSetting")}},
            },
            "responses": {
                "200": json_response(ref("Kernel"), "Set; the kernel as it is now."),
                "400": error_response(
                    "Not a non-negative integer, or more GPUs than any host has (the message "
                    "says the largest host's count)."
                ),
                "404": error_response("No such kernel."),
                "409": error_response("The policy holds a kernel's GPUs for its whole life."),
                **_AUTH_ERRORS,
            },
        },
    },
    "/api/fleet/kernels/{kernel_id}/replicas/{replica_id}/migrate": {
        "parameters": [_KERNEL_ID, _REPLICA_ID],
        "post": {
            "operationId": "migrateReplica",
            "summary": "Move a replica: a new one joins the group in its place, then it stops.",
            "requestBody": {
                "required": False,
                "content": {"application/json": {"schema": ref("Migration")}},
            },
            "responses": {
                "200": json_response(ref("Kernel"), "Moved; the kernel as it is now."),
                "400": error_response("Not a valid body."),
                "404": error_response("No such kernel, replica or host."),
                "409": error_response(
                    "It cannot move: the kernel is not replicated, the replica is not ready, "
                    "or the host is lost or already holds one of the kernel's replicas."
                ),
                "500": error_response("The new replica failed to start (`kernel-start-failed`)."),
                "502": error_response("A host agent did not answer."),
                "503": error_response("No host can take the new replica."),
                **_AUTH_ERRORS,
            },
        },
    },
}

_SCHEMAS.update(job_schemas())
_PATHS.update(job_paths(_AUTH_ERRORS))
_SCHEMAS.update(gpu_settings_schemas())
_PATHS.update(gpu_settings_paths(_KERNEL_ID, _AUTH_ERRORS))
_SCHEMAS.update(tool_worker_schemas())
_PATHS.update(tool_worker_paths(_KERNEL_ID, _AUTH_ERRORS))

_SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "kernelfleet admin API",
        "version": __version__,
        "description": (
            "Hosts and kernels as the platform sees them. Field names are a stable contract. "
            'Every error is JSON `{"reason", "message"}`.'
        ),
    },
    "paths": _PATHS,
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {
            "token": {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "`Authorization: token <token>` (or `Bearer <token>`).",
            },
            "tokenArgument": {"type": "apiKey", "in": "query", "name": "token"},
        },
    },
    "security": [{"token": []}, {"tokenArgument": []}],
}


def spec(server_url: str | None = None) -> dict[str, Any]:
    """A fresh copy of the admin API's description; `server_url` (the gateway's base URL, no
    trailing slash) becomes its only ``servers`` entry."""
    result = copy.deepcopy(_SPEC)
    if server_url is not None:
        result["servers"] = [{"url": server_url}]
    return result
