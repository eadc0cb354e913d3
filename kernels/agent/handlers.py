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

Handlers only translate: they parse, call the ``ReplicaTable`` / ``HostReport`` in the
application settings, and raise domain errors that ``ApiHandler`` maps to status codes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernelfleet.kernels.agent.replicas import ReplicaRequest, ReplicaTable, parse_timeout
from kernelfleet.web import ApiHandler, NotFoundHandler

_ID = r"(?P<replica_id>[^/]+)"


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


def handlers() -> list[tuple[str, type[ApiHandler]]]:
    """The URL table of the host agent API."""
    return [
        (r"/api/host", HostHandler),
        (r"/api/replicas", ReplicasHandler),
        (rf"/api/replicas/{_ID}", ReplicaHandler),
        (rf"/api/replicas/{_ID}/interrupt", InterruptHandler),
        (rf"/api/replicas/{_ID}/restart", RestartHandler),
        (r".*", NotFoundHandler),
    ]
