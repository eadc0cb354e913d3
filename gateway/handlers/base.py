"""What every gateway endpoint shares: the token check, JSON errors and the services.

The token check (`kernelfleet.web.TokenAuthMixin`) takes the fleet token everywhere and a
kernel-scoped token where a handler's ``kernel_access`` allows it: every gateway handler
refuses kernel tokens (403) unless it names the method there. The gateway's settings carry
``kernel_token_check`` (`KernelService.kernel_of_token`), so a forged token, or one whose
kernel is gone, is refused with 401 and a warning in the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelfleet.web import ApiHandler

if TYPE_CHECKING:
    from kernelfleet.gateway.hosts import HostRegistry
    from kernelfleet.gateway.kernel_service import KernelService
    from kernelfleet.gateway.kernelspecs import KernelSpecCatalog


class GatewayHandler(ApiHandler):
    """Base of the gateway's JSON endpoints; ``kernel_principal`` is the kernel whose token
    the request presented (None: the fleet token)."""

    @property
    def kernels(self) -> KernelService:
        return self.settings["kernel_service"]

    @property
    def hosts(self) -> HostRegistry:
        return self.settings["host_registry"]

    @property
    def kernelspecs(self) -> KernelSpecCatalog:
        return self.settings["kernelspecs"]
