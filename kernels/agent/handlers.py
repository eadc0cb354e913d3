"""The host agent's HTTP API (token-protected JSON, errors as ``{"reason", "message"}``).

::

    GET    /api/host                          {"id", "address", "gpus", "replicas"}
    GET    /api/replicas                      [replica model, ...]
    POST   /api/replicas                      201 replica model, once ready (body:
                                              `ReplicaRequest`, the kernel's token in it)
    GET    /api/replicas/{id}                 replica model
    POST   /api/replicas/{id}/interrupt       204
    POST   /api/replicas/{id}/restart         200 replica model, once ready again
    DELETE /api/replicas/{id}                 204
    GET    /api/jobs                          [job model, ...]
    POST   /api/jobs                          201 job model, once launched (body: `JobRequest`)
    GET    /api/jobs/{id}                     job model
    GET    /api/jobs/{id}/log?tail=N          {"id", "lines"}: the end of its stdout+stderr
    POST   /api/jobs/{id}/stop                job model, once it exited (body: {"grace": s})
    DELETE /api/jobs/{id}                     204: forget an exited job and its folder
    GET    /api/workers                       [worker model, ...] (tool workers: as jobs,
    POST   /api/workers                       ... the body a `WorkerRequest`;
    GET    /api/workers/{id}                  ... `kernels.agent.tool_workers`)
    GET    /api/workers/{id}/log?tail=N
    POST   /api/workers/{id}/stop
    DELETE /api/workers/{id}
    GET    /api/gpu-settings?uuid=U[&uuid=V]  {"devices": [{"uuid", "index", "current",
                                              "default", "ranges", "changed", "owner"}, ...]}
    PUT    /api/gpu-settings                  {"devices": [{"uuid", "index", "applied",
                                              "calls"}, ...]} (body: {"uuids", "owner",
                                              "settings", "dry_run"?}; `GpuSettings.apply`)
    POST   /api/gpu-settings/reset            {"devices": [{"uuid", "index", "calls"}, ...]}
                                              (body: {"uuids"?, "kernel_id"?, "binding"?})

Handlers only translate: they parse, call the ``ReplicaTable`` / ``HostReport`` in the
application settings, and raise domain errors that ``ApiHandler`` maps to status codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.agent.gpu_control import parse_settings
from kernelfleet.kernels.agent.gpu_settings import GpuSettings, Owner
from kernelfleet.kernels.agent.jobs import JobRequest, JobTable
from kernelfleet.kernels.agent.replicas import ReplicaRequest, ReplicaTable, parse_timeout
from kernelfleet.kernels.agent.tool_workers import WorkerRequest
from kernelfleet.web import ApiHandler, NotFoundHandler

_ID = r"(?P<replica_id>[^/]+)"
_JOB = r"(?P<job_id>[^/]+)"


class AgentHandler(ApiHandler):
    @property
    def replicas(self) -> ReplicaTable:
        table: ReplicaTable = self.settings["replicas"]
        return table

    def host_report(self) -> dict[str, Any]:
        report: Callable[[], dict[str, Any]] = self.settings["host_report"]
        return report()


class HostHandler(AgentHandler):
    def get(self) -> None:
        self.write_json(self.host_report())


class ReplicasHandler(AgentHandler):
    def get(self) -> None:
        self.write_json(self.replicas.models())

    async def post(self) -> None:
        request = ReplicaRequest.from_json(self.json_body())
        replica = await self.replicas.start(request)
        self.set_header("Location", f"/api/replicas/{replica.id}")
        self.write_json(replica.model(), status=201)


class ReplicaHandler(AgentHandler):
    def get(self, replica_id: str) -> None:
        self.write_json(self.replicas.get(replica_id).model())

    async def delete(self, replica_id: str) -> None:
        await self.replicas.stop(replica_id)
        self.set_status(204)
        self.finish()


class InterruptHandler(AgentHandler):
    async def post(self, replica_id: str) -> None:
        await self.replicas.interrupt(replica_id)
        self.set_status(204)
        self.finish()


class RestartHandler(AgentHandler):
    async def post(self, replica_id: str) -> None:
        timeout = parse_timeout(self.json_body().get("launch_timeout"), "launch_timeout")
        replica = await self.replicas.restart(replica_id, launch_timeout=timeout)
        self.write_json(replica.model())


class JobsHandlerBase(AgentHandler):
    """The job handlers serve the tool workers too: `table` names the setting that holds the
    table, `request_type` the class that parses a start."""

    table = "jobs"
    request_type: type[JobRequest] = JobRequest

    @property
    def jobs(self) -> JobTable:
        table: JobTable = self.settings[self.table]
        return table


class JobsHandler(JobsHandlerBase):
    def get(self) -> None:
        self.write_json(self.jobs.models())

    async def post(self) -> None:
        job = await self.jobs.start(self.request_type.from_json(self.json_body()))
        self.write_json(job.model(), status=201)


class JobHandler(JobsHandlerBase):
    def get(self, job_id: str) -> None:
        self.write_json(self.jobs.get(job_id).model())

    def delete(self, job_id: str) -> None:
        self.jobs.forget(job_id)
        self.set_status(204)
        self.finish()


class JobLogHandler(JobsHandlerBase):
    def get(self, job_id: str) -> None:
        try:
            tail = int(self.get_argument("tail", "100"))
        except ValueError:
            raise InvalidRequest("'tail' must be a number of lines") from None
        self.write_json({"id": job_id, "lines": self.jobs.get(job_id).log_tail(max(tail, 0))})


class JobStopHandler(JobsHandlerBase):
    async def post(self, job_id: str) -> None:
        grace = parse_timeout(self.json_body().get("grace"), "grace")
        job = await self.jobs.stop(job_id, 30.0 if grace is None else grace)
        self.write_json(job.model())


class WorkersHandler(JobsHandler):
    table, request_type = "workers", WorkerRequest


class WorkerHandler(JobHandler):
    table = "workers"


class WorkerLogHandler(JobLogHandler):
    table = "workers"


class WorkerStopHandler(JobStopHandler):
    table = "workers"


class GpuSettingsBase(AgentHandler):
    @property
    def gpu_settings(self) -> GpuSettings:
        settings: GpuSettings = self.settings["gpu_settings"]
        return settings


class GpuSettingsHandler(GpuSettingsBase):
    def get(self) -> None:
        uuids = self.get_arguments("uuid") or self.gpu_settings.control_uuids()
        self.write_json({"devices": self.gpu_settings.read(uuids)})

    def put(self) -> None:
        body = self.json_body()
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidRequest("'dry_run' must be true or false")
        settings = body.get("settings")
        if not isinstance(settings, dict):
            raise InvalidRequest("'settings' must be an object of knobs")
        devices = self.gpu_settings.apply(
            _uuids(body.get("uuids")),
            Owner.from_json(body.get("owner")),
            parse_settings(settings),
            dry_run=dry_run,
        )
        self.write_json({"devices": devices})


class GpuSettingsResetHandler(GpuSettingsBase):
    def post(self) -> None:
        body = self.json_body()
        uuids = body.get("uuids")
        filters = {name: body.get(name) for name in ("kernel_id", "binding")}
        for name, value in filters.items():
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"{name!r} must be a string")
        devices = self.gpu_settings.reset(
            None if uuids is None else _uuids(uuids),
            kernel_id=filters["kernel_id"],
            binding=filters["binding"],
        )
        self.write_json({"devices": devices})


def _uuids(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise InvalidRequest("'uuids' must be a list of GPU UUIDs")
    return value


def handlers() -> list[tuple[str, type[ApiHandler]]]:
    """The URL table of the host agent API."""
    return [
        (r"/api/host", HostHandler),
        (r"/api/replicas", ReplicasHandler),
        (rf"/api/replicas/{_ID}", ReplicaHandler),
        (rf"/api/replicas/{_ID}/interrupt", InterruptHandler),
        (rf"/api/replicas/{_ID}/restart", RestartHandler),
        (r"/api/jobs", JobsHandler),
        (rf"/api/jobs/{_JOB}", JobHandler),
        (rf"/api/jobs/{_JOB}/log", JobLogHandler),
        (rf"/api/jobs/{_JOB}/stop", JobStopHandler),
        (r"/api/workers", WorkersHandler),
        (rf"/api/workers/{_JOB}", WorkerHandler),
        (rf"/api/workers/{_JOB}/log", WorkerLogHandler),
        (rf"/api/workers/{_JOB}/stop", WorkerStopHandler),
        (r"/api/gpu-settings", GpuSettingsHandler),
        (r"/api/gpu-settings/reset", GpuSettingsResetHandler),
        (r".*", NotFoundHandler),
    ]
