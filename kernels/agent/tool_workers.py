"""The tool workers one host agent runs for kernels' cells: ``python -m MODULE ARGS``.

A running cell may have the gateway start worker processes of a tool on GPUs of any hosts
(``POST /api/fleet/kernels/{id}/workers``, `kernelfleet.gateway.tool_workers`): the pipeline's
stage workers, say. The gateway places them and calls each host's agent (``POST
/api/workers``), which launches them with the same machinery as background jobs
(`kernelfleet.kernels.agent.jobs.JobTable`: its own session, stdout and stderr to a log of the
agent's, SIGTERM then SIGKILL to stop it, an exit reported at once in the host report's
``workers``), with these differences:

- what runs is ``python -u -m MODULE ARGS``, and only a module of
  `kernelfleet.protocol.TOOL_WORKER_MODULES`: the gateway checks the request against the same
  list and the agent checks again;
- it runs as the user of the kernel it serves (`Isolation.owner` of the kernel id) when kernels
  run as users of their own, so it reads and writes what the kernel may and nothing else;
- its environment is the agent's, scrubbed of the fleet token and of the gateway's address,
  plus the keys of `kernelfleet.protocol.TOOL_WORKER_ENV` the request gives, and
  ``CUDA_VISIBLE_DEVICES`` (and ``KERNELFLEET_GPUS``) exactly its devices;
- a worker outlives no agent: an agent stops all its workers when it stops, and one started
  again stops those a previous agent left running and removes their folders (`end_leftovers`);
  the gateway, seeing a restarted agent report without them, counts them exited, and the run
  they served fails.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.agent.jobs import SCRUBBED_ENV, JobRequest, JobTable
from kernelfleet.kernels.agent.kernel_process import ReplicaFolders
from kernelfleet.protocol import (
    JobEnv,
    ReplicaEnv,
    check_tool_args,
    check_tool_env,
    check_tool_module,
)

WORKER_ID = re.compile(r"wrk-[A-Za-z0-9_-]{1,64}")
KERNEL_ID = re.compile(r"[\w-]{1,128}")


@dataclass(frozen=True)
class WorkerRequest(JobRequest):
    """``POST /api/workers``: ``{"worker_id", "kernel_id", "module", "args", "devices",
    "env"}``. ``job_id`` is the worker's id (``wrk-...``)."""

    module: str = ""
    kernel_id: str = ""

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> WorkerRequest:
        worker_id, kernel_id = body.get("worker_id"), body.get("kernel_id")
        if not isinstance(worker_id, str) or not WORKER_ID.fullmatch(worker_id):
            raise InvalidRequest(f"'worker_id' must match {WORKER_ID.pattern}, not {worker_id!r}")
        if not isinstance(kernel_id, str) or not KERNEL_ID.fullmatch(kernel_id):
            raise InvalidRequest(f"'kernel_id' must be a kernel id, not {kernel_id!r}")
        devices = body.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise InvalidRequest("'devices' must be a list of device ids")
        return cls(
            job_id=worker_id,
            devices=tuple(devices),
            env=check_tool_env(body.get("env", {})),
            args=check_tool_args(body.get("args", [])),
            module=check_tool_module(body.get("module")),
            kernel_id=kernel_id,
        )


class WorkerTable(JobTable):
    """The tool workers of this agent: a `JobTable` whose processes run an allowed module as
    the kernel's user; see the module docstring. Requests must be `WorkerRequest`."""

    FOLDER = "workers"
    NOUN = "worker"

    def _owner(self, request: JobRequest) -> tuple[int, int] | None:
        assert isinstance(request, WorkerRequest)
        return self.isolation.owner(request.kernel_id)

    def _command(self, request: JobRequest, folders: ReplicaFolders) -> list[str]:
        assert isinstance(request, WorkerRequest)
        return [sys.executable, "-u", "-m", check_tool_module(request.module), *request.args]

    def _job_env(self, request: JobRequest, folder_env: Mapping[str, str]) -> dict[str, str]:
        gone = {*SCRUBBED_ENV, *(name.value for name in JobEnv), ReplicaEnv.KERNEL_TOKEN.value}
        env = {k: v for k, v in self._base_env.items() if k not in gone}
        env.update(check_tool_env(dict(request.env)))
        env.update(folder_env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(request.devices)
        env["KERNELFLEET_GPUS"] = ",".join(request.devices)
        return env

    async def end_leftovers(self, grace: float) -> list[str]:
        """At agent start: stop the workers a previous agent left running (SIGTERM, `grace`,
        SIGKILL) and forget them all, folders included. Returns their ids."""
        found = self.adopt()
        await self.stop_all(grace)
        for worker_id in found:
            self.forget(worker_id)
        return found
