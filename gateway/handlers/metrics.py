"""``GET /metrics``: the gateway's Prometheus metrics, behind the same token as every endpoint.

The registry comes from the tornado settings key ``metrics`` (the gateway's private
`MetricsRegistry`, a prometheus_client `CollectorRegistry`).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest

from kernelfleet.gateway.handlers.base import GatewayHandler


class MetricsHandler(GatewayHandler):
    """Serves the registry through `generate_latest`, the text exposition format 0.0.4, under
    that format's content type (prometheus_client's ``CONTENT_TYPE_LATEST`` names 1.0.0 since
    0.23, which is not what `generate_latest` writes by default); errors stay JSON."""

    @property
    def metrics(self) -> CollectorRegistry:
        return self.settings["metrics"]

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.finish(generate_latest(self.metrics))
