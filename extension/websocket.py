"""A gateway websocket relay for jupyter_server: v1 framing, binary frames, no Nagle."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from jupyter_server.gateway.connections import GatewayWebSocketConnection
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.utils import url_escape, url_path_join
from tornado.concurrent import Future
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import WebSocketClosedError, websocket_connect
from traitlets import Unicode


class FleetGatewayWebSocketConnection(GatewayWebSocketConnection):
    """jupyter_server's gateway relay, mended in three ways.

    - It accepts the ``v1.kernel.websocket.jupyter.org`` subprotocol that JupyterLab offers and
      asks the gateway for the same one, relaying frames unchanged. The stock relay answers the
      offer with no subprotocol; Chrome then aborts the handshake, JupyterLab reconnects in
      legacy framing, and the first gateway websocket is left open, orphaned.
    - Binary frames stay binary. The stock relay decodes every gateway frame as UTF-8 (a message
      with buffers is lost, and the read loop dies on the first non-UTF-8 byte) and sends the
      browser's binary frames to the gateway as text.
    - TCP_NODELAY on both legs.
    """

    kernel_ws_protocol = Unicode(
        None,
        allow_none=True,
        config=True,
        help="None: v1 when the client offers it, else legacy (the server's own rule).",
    )

    async def connect(self) -> None:
        """Open the gateway websocket in the framing the client chose."""
        self.websocket_handler.set_nodelay(True)
        self.ws = None
        gateway = GatewayClient.instance()
        ws_url = url_path_join(
            gateway.ws_url or "", gateway.kernels_endpoint, url_escape(self.kernel_id), "channels"
        )
        if self.session_id:
            ws_url += f"?session_id={url_escape(self.session_id)}"
        subprotocol = self.websocket_handler.selected_subprotocol
        self.log.info("Connecting to %s (%s framing)", ws_url, subprotocol or "legacy")
        request = HTTPRequest(ws_url, **gateway.load_connection_args())
        connecting = cast(
            "Future[Any]",
            websocket_connect(request, subprotocols=[subprotocol] if subprotocol else None),
        )
        self.ws_future = connecting
        connecting.add_done_callback(self._connection_done)
        IOLoop.current().add_future(connecting, lambda _: self._start_reading())

    def _start_reading(self) -> None:
        IOLoop.current().spawn_callback(self._read_messages)

    def _connection_done(self, fut: Any) -> None:
        super()._connection_done(fut)
        if self.ws is not None and self.ws.protocol is not None:
            self.ws.protocol.set_nodelay(True)

    async def _read_messages(self) -> None:
        while self.ws is not None and not self.disconnected:
            try:
                message = await self.ws.read_message()
            except Exception as e:
                self.log.error("Exception reading message from the gateway websocket: %s", e)
                message = None
            if message is None:
                if not self.disconnected:
                    self.log.warning("Lost connection to the gateway for kernel %s", self.kernel_id)
                break
            self.handle_outgoing_message(message)
        await self._reconnect_unless_closed()

    async def _reconnect_unless_closed(self) -> None:
        client = GatewayClient.instance()
        if self.disconnected or self.retry >= client.gateway_retry_max:
            return
        delay = min(
            client.gateway_retry_interval * 2**self.retry, client.gateway_retry_interval_max
        )
        delay += random.uniform(0.1, 1.0)
        self.retry += 1
        self.log.info(
            "Reconnecting to the gateway in %.1f s (%d/%d): kernel %s",
            delay,
            self.retry,
            client.gateway_retry_max,
            self.kernel_id,
        )
        await asyncio.sleep(delay)
        IOLoop.current().spawn_callback(self.connect)

    def handle_outgoing_message(self, incoming_msg: str | bytes, *args: Any) -> None:
        """Send a gateway frame to the notebook client, binary if it came binary."""
        try:
            self.websocket_handler.write_message(
                incoming_msg, binary=isinstance(incoming_msg, bytes)
            )
        except WebSocketClosedError:
            self.log.debug("The notebook client closed its websocket; a message was dropped")

    def _write_message(self, message: str | bytes) -> None:
        """Send a client frame to the gateway, binary if it came binary."""
        try:
            if not self.disconnected and self.ws is not None:
                self.ws.write_message(message, binary=isinstance(message, bytes))
        except Exception as e:
            self.log.error("Exception writing message to the gateway websocket: %s", e)
