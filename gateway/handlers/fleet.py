"""The fleet admin API (JSON, same token): hosts and kernels as the platform sees them.

Field names are a stable contract read by tools outside the project.
"""

from __future__ import annotations

import time
from typing import Any

from kernelfleet.errors import NotFound
from kernelfleet.gateway.handlers.base import GatewayHandler


class FleetHostsHandler(GatewayHandler):
    def host_models(self) -> list[dict[str, Any]]:
        views = {view.id: view for view in self.kernels.snapshot().hosts}
        return [
            {
                "id": host.id,
                "address": host.address,
                "state": host.state.value,
                "gpus": {
                    "total": views[host.id].gpus_total,
                    "subscribed": views[host.id].gpus_subscribed,
                    "committed": views[host.id].gpus_committed,
                },
            }
            for host in self.hosts.all()
        ]

    def get(self) -> None:
        self.write_json(self.host_models())


class FleetHostHandler(FleetHostsHandler):
    def get(self, host_id: str) -> None:
        self.hosts.get(host_id)
        model = next((m for m in self.host_models() if m["id"] == host_id), None)
        if model is None:
            raise NotFound(f"no host with id {host_id!r}")
        self.write_json(model)

    def put(self, host_id: str) -> None:
        """A host agent's registration and heartbeat (one idempotent call)."""
        host = self.hosts.report(host_id, self.json_body(), now=time.monotonic())
        self.write_json({"id": host.id, "state": host.state.value})


class FleetKernelsHandler(GatewayHandler):
    def get(self) -> None:
        self.write_json([kernel.fleet_model() for kernel in self.kernels.all()])


class FleetKernelHandler(GatewayHandler):
    def get(self, kernel_id: str) -> None:
        self.write_json(self.kernels.get(kernel_id).fleet_model())
