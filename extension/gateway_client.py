"""Run notebooks on the fleet from scripts: nbclient and papermill through the gateway.

jupyter_server's ``GatewayKernelManager`` starts kernels on a gateway, but its client opens the
channels websocket without the ``Authorization`` header, so an authenticated gateway refuses it,
and it starts ``python3`` unless ``start_kernel`` is passed another name, which nbclient never
does. `FleetKernelManager` is that manager with a client that sends the header, and which
starts the kernelspec it was made with::

    GatewayClient.instance(url="http://127.0.0.1:8765", auth_token=TOKEN)
    NotebookClient(notebook, km=FleetKernelManager(kernel_name="python3-1gpu")).execute()
"""

from __future__ import annotations

from threading import Thread
from typing import Any

import websocket
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelClient, GatewayKernelManager
from jupyter_server.utils import url_escape, url_path_join
from traitlets import DottedObjectName, Type


class FleetKernelClient(GatewayKernelClient):
    """A gateway kernel client that authenticates its websocket like its REST calls."""

    async def start_channels(  # type: ignore[override]  # async, as in GatewayKernelClient
        self,
        shell: bool = True,
        iopub: bool = True,
        stdin: bool = True,
        hb: bool = True,
        control: bool = True,
    ) -> None:
        gateway = GatewayClient.instance()
        ws_url = url_path_join(
            gateway.ws_url or "", gateway.kernels_endpoint, url_escape(self.kernel_id), "channels"
        )
        headers = gateway.load_connection_args().get("headers", {})
        self.channel_socket = websocket.create_connection(
            ws_url,
            timeout=gateway.KERNEL_LAUNCH_TIMEOUT,
            enable_multithread=True,
            header=[f"{name}: {value}" for name, value in headers.items()],
            sslopt={
                "ca_certs": gateway.ca_certs,
                "certfile": gateway.client_cert,
                "keyfile": gateway.client_key,
            },
        )
        # The parent's start_channels would open a second, unauthenticated socket: skip to its base.
        AsyncKernelClient.start_channels(self, shell, iopub, stdin, hb, control)
        self.response_router = Thread(target=self._route_responses, daemon=True)
        self.response_router.start()


class FleetKernelManager(GatewayKernelManager):
    """`GatewayKernelManager` whose clients authenticate and which can tell a dead kernel."""

    client_class = DottedObjectName("kernelfleet.extension.gateway_client.FleetKernelClient")
    client_factory = Type(klass="kernelfleet.extension.gateway_client.FleetKernelClient")

    async def start_kernel(self, **kwargs: Any) -> None:  # type: ignore[override]  # async, as in GatewayKernelManager
        """Start a kernel of ``kernel_name`` (this manager's kernelspec, unless the call names
        another) on the gateway, or attach to the running one ``kernel_id`` names; `kwargs`
        as `GatewayKernelManager.start_kernel` takes them (``env``, ``cwd``...)."""
        if kwargs.get("kernel_id") is None and not kwargs.get("kernel_name"):
            kwargs["kernel_name"] = self.kernel_name
        await super().start_kernel(**kwargs)

    async def _async_is_alive(self) -> bool:
        """Alive while the gateway knows the kernel and does not report it dead.

        jupyter_client's clients call this (``wait_for_ready`` does); jupyter_server's gateway
        manager only defines the public ``is_alive``.
        """
        if not self.has_kernel:
            return False
        self.kernel = await self.refresh_model()
        return self.kernel is not None and self.kernel.get("execution_state") != "dead"
