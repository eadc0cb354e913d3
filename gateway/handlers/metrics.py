"""``GET /metrics``: the gateway's Prometheus metrics, behind the same token as every endpoint.

The registry comes from the tornado settings key ``metrics`` (a `MetricsRegistry`).
"""

from __future__ import annotations

from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.gateway.metrics import CONTENT_TYPE, MetricsRegistry


class MetricsHandler(GatewayHandler):
    """Serves `MetricsRegistry.render()` as ``text/plain; version=0.0.4``; errors stay JSON."""

    @property
    def metrics(self) -> MetricsRegistry:
        return self.settings["metrics"]

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.metrics.render())
