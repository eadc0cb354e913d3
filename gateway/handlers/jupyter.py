"""The Jupyter gateway REST contract (docs/gateway-contract.md): kernelspecs and kernels."""

from __future__ import annotations

import mimetypes

from kernelfleet.gateway.handlers.base import GatewayHandler


class KernelSpecsHandler(GatewayHandler):
    def get(self) -> None:
        self.write_json(self.kernelspecs.models())


class KernelSpecHandler(GatewayHandler):
    def get(self, name: str) -> None:
        self.write_json(self.kernelspecs.model(name))


class KernelSpecResourceHandler(GatewayHandler):
    """Raw resource files (logos) of a kernelspec."""

    def get(self, name: str, filename: str) -> None:
        path = self.kernelspecs.resource_path(name, filename)
        self.set_header(
            "Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        )
        self.set_header("Cache-Control", "max-age=3600")
        self.finish(path.read_bytes())


class KernelsHandler(GatewayHandler):
    def get(self) -> None:
        self.write_json([kernel.model() for kernel in self.kernels.all()])

    async def post(self) -> None:
        body = self.json_body()
        kernel = await self.kernels.start(body.get("name"), body.get("env"))
        self.set_header("Location", f"/api/kernels/{kernel.id}")
        self.write_json(kernel.model(), status=201)


class KernelHandler(GatewayHandler):
    def get(self, kernel_id: str) -> None:
        self.write_json(self.kernels.get(kernel_id).model())

    async def delete(self, kernel_id: str) -> None:
        await self.kernels.shutdown(kernel_id)
        self.set_status(204)
        self.finish()


class KernelActionHandler(GatewayHandler):
    async def post(self, kernel_id: str, action: str) -> None:
        if action == "interrupt":
            await self.kernels.interrupt(kernel_id)
            self.set_status(204)
            self.finish()
        else:
            kernel = await self.kernels.restart(kernel_id)
            self.write_json(kernel.model())
