"""``/api/fleet/kernels/{id}/workers``: the tool workers of a kernel's running cell
(`kernelfleet.gateway.tool_workers`). The fleet token, or the kernel's own token (403 for
another kernel's), may start, read and end them."""

from __future__ import annotations

from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.gateway.tool_workers import ToolWorkerService
from kernelfleet.web import KernelAccess

_OWN = KernelAccess.OWN
_GROUP_ID = r"(?P<group_id>wg-[\w-]+)"


class ToolWorkersBase(GatewayHandler):
    @property
    def workers(self) -> ToolWorkerService:
        service: ToolWorkerService = self.settings["tool_workers"]
        return service


class ToolWorkersHandler(ToolWorkersBase):
    """``GET``: the kernel's groups of workers; ``POST``: start a group (201)."""

    kernel_access = {"GET": _OWN, "POST": _OWN}

    def get(self, kernel_id: str) -> None:
        self.kernels.get(kernel_id)  # 404 for no such kernel
        self.write_json([group.model() for group in self.workers.groups(kernel_id)])

    async def post(self, kernel_id: str) -> None:
        self.kernels.get(kernel_id)
        group = await self.workers.start(kernel_id, self.json_body())
        self.set_header("Location", f"/api/fleet/kernels/{kernel_id}/workers/{group.id}")
        self.write_json(group.model(), status=201)


class ToolWorkerGroupHandler(ToolWorkersBase):
    """``GET``: one group, with the log tails of its workers that exited (of all of them with
    ``?logs=all``); ``DELETE``: end it (200, its model)."""

    kernel_access = {"GET": _OWN, "DELETE": _OWN}

    async def get(self, kernel_id: str, group_id: str) -> None:
        group = self.workers.get(kernel_id, group_id)
        await self.workers.refresh_logs(group, everyone=self.get_argument("logs", "") == "all")
        self.write_json(group.model())

    async def delete(self, kernel_id: str, group_id: str) -> None:
        self.write_json((await self.workers.stop(kernel_id, group_id)).model())


def tool_worker_routes(kernel_id: str) -> list[tuple[str, type]]:
    base = rf"/api/fleet/kernels/{kernel_id}/workers"
    return [(rf"{base}/?", ToolWorkersHandler), (rf"{base}/{_GROUP_ID}/?", ToolWorkerGroupHandler)]
