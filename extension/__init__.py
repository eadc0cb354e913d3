"""The kernelfleet Jupyter server extension.

Stock ``jupyter lab --gateway-url=...`` works without it. Installed (``pip install kernelfleet``
enables it through ``jupyter_server_config.d``), it serves the JupyterLab fleet panel's API
(`kernelfleet.extension.routes`, proxying the gateway's admin API and event stream) and mends
four things in jupyter_server's
gateway websocket relay: JupyterLab's ``v1.kernel.websocket.jupyter.org`` framing is spoken end to
end (stock gateway mode refuses it, so each connection fails once and reconnects), binary frames
(messages with buffers) are passed on as binary instead of being decoded as text, Nagle's
algorithm is switched off on both legs of the relay, and a lost gateway is told to the client
(its cells in flight fail, and the kernel shows dead once reconnecting fails). A kernel the
fleet refuses shows the gateway's reason in JupyterLab, not jupyter_server's unfilled template
(`kernelfleet.extension.gateway_errors`).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.gateway.gateway_client import GatewayClient

from kernelfleet.extension.websocket import FleetGatewayWebSocketConnection

__all__ = ["FleetGatewayWebSocketConnection"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "kernelfleet.extension"}]


def _link_jupyter_server_extension(serverapp: Any) -> None:
    """Swap in the mended websocket relay, before the web app is built, in gateway mode only.

    Runs before ``ServerApp.gateway_config`` exists, so it asks `GatewayClient` (a singleton the
    server adopts later) and leaves a websocket class that the user configured alone.
    """
    if not GatewayClient.instance(parent=serverapp).gateway_enabled:
        return
    managers = serverapp.config.GatewayMappingKernelManager
    if "kernel_manager_class" not in managers:
        managers.kernel_manager_class = "kernelfleet.extension.gateway_errors." + (
            "ReadableErrorsKernelManager"
        )
    if "kernel_websocket_connection_class" in serverapp.config.get("ServerApp", {}):
        serverapp.log.info("kernelfleet: keeping the configured kernel websocket connection class")
        return
    serverapp.kernel_websocket_connection_class = FleetGatewayWebSocketConnection
    serverapp.log.info("kernelfleet: gateway websocket relay passes binary frames, TCP_NODELAY on")


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the JupyterLab panel's API under ``{base_url}kernelfleet/api/``.

    Added in every mode: outside gateway mode its routes answer 409 ``not-kernelfleet``, which
    the panel shows as "not a kernelfleet kernel" instead of failing obscurely.
    """
    from kernelfleet.extension.routes import panel_routes

    base_url = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", panel_routes(base_url))
