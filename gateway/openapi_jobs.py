"""The ``/api/fleet/jobs`` part of the admin API's OpenAPI description (`kernelfleet.gateway.
openapi` merges it in): background jobs, their policy and the what-if simulation (docs/jobs.md).
"""

from __future__ import annotations

from typing import Any

from kernelfleet.gateway.openapi_builders import (
    INT,
    STRINGS,
    closed_object,
    error_response,
    json_response,
    ref,
)

_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {**_TIME, "nullable": True}
_STATES = ["queued", "running", "stopping", "completed", "failed", "cancelled"]


def _body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def job_schemas() -> dict[str, Any]:
    return {
        "Job": closed_object(
            {
                "id": {"type": "string"},
                "name": {"type": "string"},
                "owner_kernel": {
                    "type": "string",
                    "nullable": True,
                    "description": "The kernel whose token submitted it; null: the fleet token.",
                },
                "state": {"type": "string", "enum": _STATES},
                "gpus": {"type": "integer", "minimum": 1},
                "steps": {"type": "integer", "minimum": 1},
                "steps_done": INT,
                "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
                "throughput": {
                    "type": "object",
                    "additionalProperties": {"type": "number", "minimum": 0},
                    "description": "Steps/s learned per GPU type from the job's reports.",
                },
                "lease": {
                    **closed_object(
                        {
                            "host": {"type": "string"},
                            "gpu_type": {"type": "string"},
                            "devices": STRINGS,
                        }
                    ),
                    "nullable": True,
                },
                "submitted_at": _TIME,
                "started_at": _NULLABLE_TIME,
                "finished_at": _NULLABLE_TIME,
                "preemptions": INT,
                "lost_steps": {**INT, "description": "Steps lost to kills after the grace."},
                "restarts": INT,
                "exit_code": {"type": "integer", "nullable": True},
                "error": {"type": "string", "nullable": True},
                "log_tail": STRINGS,
            }
        ),
        "JobList": closed_object(
            {"policy": {"type": "string"}, "jobs": {"type": "array", "items": ref("Job")}}
        ),
        "JobSubmission": closed_object(
            {
                "name": {"type": "string", "maxLength": 200},
                "source": {"type": "string", "description": "The script's text."},
                "function": {
                    "type": "string",
                    "description": "base64 of the cloudpickle of a zero-argument callable.",
                },
                "args": STRINGS,
                "gpus": {"type": "integer", "minimum": 1},
                "steps": {"type": "integer", "minimum": 1},
                "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
            },
            optional=("name", "source", "function", "args", "weight"),
        ),
        "JobProgress": closed_object(
            {"steps_done": INT, "checkpoint_step": INT, "throughput": {"type": "number"}},
            optional=("steps_done", "checkpoint_step", "throughput"),
        ),
        "JobLogs": closed_object({"id": {"type": "string"}, "lines": STRINGS}),
        "JobPolicy": closed_object({"policy": {"type": "string"}, "available": STRINGS}),
        "JobPolicyChoice": closed_object({"policy": {"type": "string"}}),
        "JobSimulation": closed_object({"policies": STRINGS}, optional=("policies",)),
        "JobSimulationResult": closed_object(
            {
                "policies": {
                    "type": "object",
                    "additionalProperties": closed_object(
                        {
                            "avg_jct_s": {"type": "number"},
                            "makespan_s": {"type": "number"},
                            "utilisation": {"type": "number"},
                            "ftf_rho": closed_object(
                                {
                                    "median": {"type": "number"},
                                    "p75": {"type": "number"},
                                    "max": {"type": "number"},
                                    "unfair_share": {"type": "number"},
                                }
                            ),
                            "jobs": INT,
                        }
                    ),
                }
            }
        ),
        "JobsSummary": closed_object({"queued": INT, "running": INT, "gpus_lent": INT}),
    }


def job_paths(auth_errors: dict[str, Any]) -> dict[str, Any]:
    job_id = {
        "name": "job_id",
        "in": "path",
        "required": True,
        "description": "A job's id (`job-1a2b3c4d`).",
        "schema": {"type": "string", "pattern": "^job-[A-Za-z0-9_-]+$"},
    }
    not_found = {"404": error_response("No such job (`not-found`; the message names the id).")}
    return {
        "/api/fleet/jobs": {
            "get": {
                "operationId": "listJobs",
                "summary": "Every job, newest last, and the job policy.",
                "responses": {"200": json_response(ref("JobList"), "The jobs."), **auth_errors},
            },
            "post": {
                "operationId": "submitJob",
                "summary": "Submit a job (a script or a pickled function). A kernel's token "
                "may: its kernel owns the job.",
                "requestBody": _body(ref("JobSubmission")),
                "responses": {
                    "201": json_response(ref("Job"), "Queued."),
                    "400": error_response("A bad field (`invalid-request`)."),
                    "409": error_response(
                        "No host could ever give that many GPUs (`never-fits`; the message "
                        "names the largest host)."
                    ),
                    **auth_errors,
                },
            },
        },
        "/api/fleet/jobs/policy": {
            "get": {
                "operationId": "getJobPolicy",
                "summary": "The job policy and those available.",
                "responses": {"200": json_response(ref("JobPolicy"), "The policy."), **auth_errors},
            },
            "put": {
                "operationId": "setJobPolicy",
                "summary": "Use another job policy from the next round.",
                "requestBody": _body(ref("JobPolicyChoice")),
                "responses": {
                    "200": json_response(ref("JobPolicy"), "Set."),
                    "400": error_response("An unknown policy, or not a valid body."),
                    **auth_errors,
                },
            },
        },
        "/api/fleet/jobs/simulate": {
            "post": {
                "operationId": "simulateJobs",
                "summary": "What-if: the unfinished jobs under each policy, with the job "
                "simulator, on the GPUs jobs may use and the throughputs learned so far.",
                "requestBody": _body(ref("JobSimulation"), required=False),
                "responses": {
                    "200": json_response(ref("JobSimulationResult"), "Each policy's figures."),
                    "400": error_response("An unknown policy, or not a valid body."),
                    **auth_errors,
                },
            }
        },
        "/api/fleet/jobs/{job_id}": {
            "parameters": [job_id],
            "get": {
                "operationId": "getJob",
                "summary": "One job.",
                "responses": {
                    "200": json_response(ref("Job"), "The job."),
                    **not_found,
                    **auth_errors,
                },
            },
            "delete": {
                "operationId": "cancelJob",
                "summary": "Cancel a job (stopped first if it runs: SIGTERM, grace, SIGKILL). "
                "A kernel's token may cancel its own kernel's jobs only (403 otherwise).",
                "responses": {
                    "200": json_response(ref("Job"), "Cancelled (or finished already)."),
                    **not_found,
                    **auth_errors,
                },
            },
        },
        "/api/fleet/jobs/{job_id}/logs": {
            "parameters": [job_id],
            "get": {
                "operationId": "getJobLogs",
                "summary": "The last lines of the job's stdout and stderr.",
                "parameters": [
                    {
                        "name": "tail",
                        "in": "query",
                        "required": False,
                        "description": "How many lines (100).",
                        "schema": {"type": "integer", "minimum": 0},
                    }
                ],
                "responses": {
                    "200": json_response(ref("JobLogs"), "The lines."),
                    "400": error_response("`tail` is not a number of lines."),
                    **not_found,
                    **auth_errors,
                },
            },
        },
        "/api/fleet/jobs/{job_id}/progress": {
            "parameters": [job_id],
            "post": {
                "operationId": "reportJobProgress",
                "summary": "The job's own report (`kernelfleet.jobs.sdk`), with its job token "
                "(`kfj1.`) or the fleet token.",
                "requestBody": _body(ref("JobProgress")),
                "responses": {
                    "200": json_response(ref("Job"), "Recorded."),
                    "400": error_response("Not a valid body."),
                    **not_found,
                    **auth_errors,
                },
            },
        },
    }
