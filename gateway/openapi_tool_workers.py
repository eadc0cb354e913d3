"""The ``/api/fleet/kernels/{id}/workers`` part of the admin API's OpenAPI description
(`kernelfleet.gateway.openapi` merges it in): the tool workers of a kernel's running cell
(`kernelfleet.gateway.tool_workers`)."""

from __future__ import annotations

from typing import Any

from kernelfleet.gateway.openapi_builders import (
    STRINGS,
    closed_object,
    error_response,
    json_response,
    ref,
)
from kernelfleet.protocol import TOOL_WORKER_ENV, TOOL_WORKER_MODULES

_NULLABLE_STRING = {"type": "string", "nullable": True}
_COUNT = {"type": "integer", "minimum": 1, "maximum": 1024}


def tool_worker_schemas() -> dict[str, Any]:
    return {
        "ToolWorker": closed_object(
            {
                "id": {"type": "string", "pattern": "^wrk-"},
                "index": {"type": "integer", "minimum": 0},
                "host": {"type": "string"},
                "devices": {**STRINGS, "description": "Its CUDA_VISIBLE_DEVICES on its host."},
                "state": {"type": "string", "enum": ["starting", "running", "exited"]},
                "exit_code": {"type": "integer", "nullable": True},
                "log_tail": STRINGS,
            }
        ),
        "ToolWorkerGroup": closed_object(
            {
                "id": {"type": "string", "pattern": "^wg-"},
                "kernel_id": {"type": "string"},
                "cell_id": {"type": "string", "description": "The cell it lives as long as."},
                "module": {"type": "string"},
                "state": {"type": "string", "enum": ["starting", "running", "ending", "ended"]},
                "ended_why": _NULLABLE_STRING,
                "workers": {"type": "array", "items": ref("ToolWorker")},
            }
        ),
        "ToolWorkerGroups": {"type": "array", "items": ref("ToolWorkerGroup")},
        "ToolWorkersRequest": closed_object(
            {
                "count": _COUNT,
                "gpus_each": {**_COUNT, "description": "GPUs of one host per worker (1)."},
                "module": {"type": "string", "enum": sorted(TOOL_WORKER_MODULES)},
                "args": {**STRINGS, "description": "Arguments every worker gets."},
                "args_each": {
                    "type": "array",
                    "items": STRINGS,
                    "description": "`count` lists: worker i's arguments after `args`.",
                },
                "env": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Only these names: " + ", ".join(sorted(TOOL_WORKER_ENV)),
                },
            },
            optional=("gpus_each", "args", "args_each", "env"),
        ),
    }


def tool_worker_paths(kernel_id: dict[str, Any], auth_errors: dict[str, Any]) -> dict[str, Any]:
    group_id = {
        "name": "group_id",
        "in": "path",
        "required": True,
        "description": "A group of tool workers' id (`wg-1a2b3c4d`).",
        "schema": {"type": "string", "pattern": "^wg-[A-Za-z0-9_-]+$"},
    }
    unknown = error_response("No such kernel, or no such group of its workers.")
    return {
        "/api/fleet/kernels/{kernel_id}/workers": {
            "parameters": [kernel_id],
            "get": {
                "operationId": "listToolWorkers",
                "summary": "The kernel's groups of tool workers (running, and the last few "
                "ended). The kernel's own token may.",
                "responses": {
                    "200": json_response(ref("ToolWorkerGroups"), "Its groups, oldest first."),
                    "404": unknown,
                    **auth_errors,
                },
            },
            "post": {
                "operationId": "startToolWorkers",
                "summary": "Start `count` workers of `gpus_each` GPUs each for the kernel's "
                "running cell, on any hosts (the cell's host first, then fewest hosts); their "
                "GPUs are held for the kernel until the group is deleted, all its workers "
                "exit, the cell ends, the kernel goes or a host of it is lost, and then until "
                "each worker is known stopped. GPUs lent to "
                "background jobs are taken last, the jobs preempted. The kernel's own token "
                "may.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("ToolWorkersRequest")}},
                },
                "responses": {
                    "201": json_response(ref("ToolWorkerGroup"), "Started."),
                    "400": error_response(
                        "A bad field, a module or an env name not on the allow-list "
                        "(`invalid-request`)."
                    ),
                    "404": unknown,
                    "409": error_response(
                        "The kernel runs no cell, or the workers do not fit: more GPUs than "
                        "the fleet has, or than are free now (`conflict`; the message names "
                        "the counts). It does not wait."
                    ),
                    "502": error_response("A host agent could not start a worker."),
                    **auth_errors,
                },
            },
        },
        "/api/fleet/kernels/{kernel_id}/workers/{group_id}": {
            "parameters": [kernel_id, group_id],
            "get": {
                "operationId": "getToolWorkers",
                "summary": "One group, each worker's state and exit code, and the log tails "
                "of the workers that exited (fetched from their hosts; an ended group's were "
                "fetched when it ended).",
                "parameters": [
                    {
                        "name": "logs",
                        "in": "query",
                        "required": False,
                        "description": "``all``: the log tails of the running workers too.",
                        "schema": {"type": "string", "enum": ["all"]},
                    }
                ],
                "responses": {
                    "200": json_response(ref("ToolWorkerGroup"), "The group."),
                    "404": unknown,
                    **auth_errors,
                },
            },
            "delete": {
                "operationId": "stopToolWorkers",
                "summary": "End the group: SIGTERM, a grace, SIGKILL to each worker, then its "
                "GPUs are free. Idempotent.",
                "responses": {
                    "200": json_response(ref("ToolWorkerGroup"), "Ended."),
                    "404": unknown,
                    **auth_errors,
                },
            },
        },
    }
