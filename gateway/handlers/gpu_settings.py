"""``/api/fleet/kernels/{id}/gpu-settings``: the clocks and power limits of the GPUs a kernel's
running cell holds (`kernelfleet.gateway.gpu_settings`). The fleet token may act on any kernel;
a kernel's own token on its own kernel only (403 otherwise)."""

from __future__ import annotations

from kernelfleet.gateway.gpu_settings import GpuSettingsService
from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.web import KernelAccess

_OWN = KernelAccess.OWN


class KernelGpuSettingsHandler(GatewayHandler):
    """``GET`` the bound devices' settings and ranges, ``PUT`` knobs (or a dry run),
    ``DELETE``: back to the defaults (204)."""

    kernel_access = {"GET": _OWN, "PUT": _OWN, "DELETE": _OWN}

    @property
    def gpu_settings(self) -> GpuSettingsService:
        service: GpuSettingsService = self.settings["gpu_settings"]
        return service

    async def get(self, kernel_id: str) -> None:
        self.write_json(await self.gpu_settings.read(kernel_id))

    async def put(self, kernel_id: str) -> None:
        self.write_json(await self.gpu_settings.change(kernel_id, self.json_body()))

    async def delete(self, kernel_id: str) -> None:
        await self.gpu_settings.reset(kernel_id)
        self.set_status(204)
        self.finish()
