"""The kernel channels websocket, in the v1 framing when offered, legacy otherwise.

The token is checked before the upgrade, so a wrong token gets a 401/403 JSON answer, not a
websocket. A malformed frame is logged with the reason and dropped; the connection and every
other kernel carry on.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.websocket import WebSocketClosedError, WebSocketHandler

from kernelfleet.errors import FleetError, InvalidRequest
from kernelfleet.gateway.channels import ClientLink
from kernelfleet.gateway.framing import V1_PROTOCOL, KernelMessage, parse_client_frame
from kernelfleet.web import JsonErrorsMixin, TokenAuthMixin

log = logging.getLogger("kernelfleet.gateway.websocket")


class ChannelsHandler(TokenAuthMixin, JsonErrorsMixin, WebSocketHandler):
    client: ClientLink | None = None
    protocol: str | None = None

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        """Speak v1 when the client offers it (JupyterLab does); legacy framing otherwise."""
        self.protocol = V1_PROTOCOL if V1_PROTOCOL in subprotocols else None
        return self.protocol

    def check_origin(self, origin: str) -> bool:
        # Callers are Jupyter servers and scripts, not browsers; the token is what authenticates.
        return True

    async def get(self, *args: Any, **kwargs: Any) -> None:
        self.check_token()
        # 404 before the upgrade; a kernel a restarted gateway is re-linking is waited for
        await self.settings["kernel_service"].ready_for_clients(
            kwargs["kernel_id"], self.settings.get("relink_timeout", 0.0)
        )
        await super().get(*args, **kwargs)

    def open(self, kernel_id: str) -> None:
        self.set_nodelay(True)
        self.kernel_id = kernel_id
        session_id = self.get_query_argument("session_id", "") or "anonymous"
        try:
            self.client = self.settings["kernel_service"].attach(
                kernel_id, session_id, self._deliver, self._closed_by_gateway
            )
        except FleetError as e:  # InvalidRequest, KernelDead
            log.error("websocket for kernel %s refused: %s", kernel_id, e)
            self.close(code=1011, reason=e.message[:120])
        else:
            log.info("websocket opened for kernel %s (session %s)", kernel_id, session_id)

    async def on_message(self, message: str | bytes) -> None:
        if self.client is None:
            return
        try:
            await self.client.send(parse_client_frame(message, self.protocol))
        except InvalidRequest as e:
            log.error("kernel %s: dropped a client message (%s): %s", self.kernel_id, e.reason, e)

    def on_close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        log.info("websocket closed for kernel %s", getattr(self, "kernel_id", "?"))

    def _closed_by_gateway(self) -> None:
        """The kernel was relinked or shut down: close, so the client reconnects or gives up."""
        self.client = None
        self.close(code=1012, reason="the kernel moved or stopped; reconnect")

    def _deliver(self, channel: str, message: KernelMessage) -> None:
        frame = message.to_client_frame(channel, self.protocol)
        try:
            self.write_message(frame, binary=isinstance(frame, bytes))
        except WebSocketClosedError:
            log.debug("kernel %s: client gone, dropped a %s message", self.kernel_id, channel)
