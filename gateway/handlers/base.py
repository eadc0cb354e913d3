"""What every gateway endpoint shares: the token check, JSON errors and the services."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelfleet.web import ApiHandler

if TYPE_CHECKING:
    from kernelfleet.gateway.hosts import HostRegistry
    from kernelfleet.gateway.kernel_service import KernelService
    from kernelfleet.gateway.kernelspecs import KernelSpecCatalog


class GatewayHandler(ApiHandler):
    @property
    def kernels(self) -> KernelService:
        return self.settings["kernel_service"]

    @property
    def hosts(self) -> HostRegistry:
        return self.settings["host_registry"]

    @property
    def kernelspecs(self) -> KernelSpecCatalog:
        return self.settings["kernelspecs"]
