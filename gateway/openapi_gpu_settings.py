"""The ``/api/fleet/kernels/{kernel_id}/gpu-settings`` part of the admin API's OpenAPI
description (`kernelfleet.gateway.openapi` merges it in): clocks and power limits of the GPUs a
kernel's running cell holds (`kernelfleet.gateway.gpu_settings`)."""

from __future__ import annotations

from typing import Any

from kernelfleet.gateway.openapi_builders import (
    closed_object,
    error_response,
    json_response,
    ref,
)

_MHZ = {"type": "integer", "minimum": 1}
_WATTS = {"type": "number", "exclusiveMinimum": True, "minimum": 0}


_KNOBS = {"gpu_clock_mhz": _MHZ, "mem_clock_mhz": _MHZ, "power_limit_w": _WATTS}
_ALL_KNOBS = closed_object(_KNOBS)
_SOME_KNOBS = closed_object(_KNOBS, optional=tuple(_KNOBS))
_WHERE = {
    "kernel_id": {"type": "string"},
    "host_id": {"type": "string", "description": "The host whose GPUs they are."},
    "cell_id": {
        "type": "string",
        "description": "The ledger binding: the running cell's id (`session` for a kernel "
        "holding its GPUs for its whole life).",
    },
}


def gpu_settings_schemas() -> dict[str, Any]:
    device = {
        "uuid": {"type": "string"},
        "index": {"type": "integer", "minimum": 0, "description": "The device on its host."},
    }
    return {
        "GpuSettingsChange": {
            **closed_object(
                {**_KNOBS, "dry_run": {"type": "boolean", "default": False}},
                optional=(*_KNOBS, "dry_run"),
            ),
            "description": "One or more knobs; `dry_run`: answer the NVML calls, change nothing.",
        },
        "GpuSettings": closed_object(
            {
                **_WHERE,
                "devices": {
                    "type": "array",
                    "items": closed_object(
                        {
                            **device,
                            "current": _ALL_KNOBS,
                            "default": {
                                **_ALL_KNOBS,
                                "description": "With nothing locked: the maximum clocks and "
                                "the default power limit.",
                            },
                            "ranges": closed_object(
                                {
                                    "gpu_clock_mhz": {"type": "array", "items": _MHZ},
                                    "mem_clock_mhz": {"type": "array", "items": _MHZ},
                                    "power_limit_w": {
                                        "type": "array",
                                        "items": _WATTS,
                                        "minItems": 2,
                                        "maxItems": 2,
                                    },
                                }
                            ),
                            "changed": {
                                **_SOME_KNOBS,
                                "description": "What was set and is not reset yet.",
                            },
                        }
                    ),
                },
            }
        ),
        "GpuSettingsApplied": closed_object(
            {
                **_WHERE,
                "dry_run": {"type": "boolean"},
                "devices": {
                    "type": "array",
                    "items": closed_object(
                        {
                            **device,
                            "applied": _SOME_KNOBS,
                            "calls": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "The NVML calls made (planned, in a dry run): "
                                "`nvmlDeviceSetGpuLockedClocks(0, 1200, 1200)`...",
                            },
                        }
                    ),
                },
            }
        ),
    }


def gpu_settings_paths(kernel_id: dict[str, Any], auth_errors: dict[str, Any]) -> dict[str, Any]:
    not_bound = error_response(
        "No running cell of the kernel holds GPUs (`no-gpus-bound`), or its host no longer "
        "reports them."
    )
    no_agent = error_response("The host agent did not answer, or NVML failed there.")
    refused = error_response(
        "A kernel token of another kernel (`forbidden`), or NVML refused the change "
        "(`permission-denied`: the host agent is not root): nothing stays changed."
    )
    unknown = error_response("No such kernel.")
    return {
        "/api/fleet/kernels/{kernel_id}/gpu-settings": {
            "parameters": [kernel_id],
            "get": {
                "operationId": "getKernelGpuSettings",
                "summary": "The clocks, power limits and ranges of the GPUs the kernel's running "
                "cell holds. A kernel's own token may.",
                "responses": {
                    "200": json_response(ref("GpuSettings"), "The bound devices."),
                    "404": unknown,
                    "409": not_bound,
                    "502": no_agent,
                    **auth_errors,
                },
            },
            "put": {
                "operationId": "setKernelGpuSettings",
                "summary": "Lock the GPU or memory clock, or set the power limit, of every GPU "
                "the kernel's running cell holds, all or nothing; reset when the cell releases "
                "them, however it ends. A kernel's own token may.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref("GpuSettingsChange")}},
                },
                "responses": {
                    "200": json_response(
                        ref("GpuSettingsApplied"), "Set (or planned, in a dry run)."
                    ),
                    "400": error_response(
                        "An unknown knob, nothing to set, or a value outside a device's ranges "
                        "(`invalid-request`; the message lists what is supported)."
                    ),
                    "404": unknown,
                    "409": not_bound,
                    "502": no_agent,
                    **auth_errors,
                    "403": refused,
                },
            },
            "delete": {
                "operationId": "resetKernelGpuSettings",
                "summary": "Back to the defaults now (nothing to do when no cell holds GPUs). "
                "A kernel's own token may.",
                "responses": {
                    "204": {"description": "Reset."},
                    "404": unknown,
                    "409": error_response("The host no longer reports the bound GPUs."),
                    "502": no_agent,
                    **auth_errors,
                    "403": refused,
                },
            },
        }
    }
