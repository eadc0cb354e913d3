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

from kernelfleet.extension.cells_in_flight import CellsInFlight


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

    And it tells the client when the gateway is lost (killed, or out of reach): the cells then
    in flight fail at once with a ``GatewayUnreachable`` error (their replies cannot come), what
    the client sends meanwhile waits for the reconnection, and once the reconnection attempts
    (`GatewayClient.gateway_retry_max`) are spent, the client gets a ``dead`` status and its
    websocket closes, instead of a kernel shown idle with its cells at ``[*]`` for ever
    (`kernelfleet.extension.cells_in_flight`).
    """

    _cells: CellsInFlight | None = None
    _lost = False  # the gateway websocket closed, or failed to open, and no new one is open
    _held: list[str | bytes] | None = None  # what the client sent while lost

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
        if self.ws is None:
            self._lost = not self.disconnected
            return
        if self.ws.protocol is not None:
            self.ws.protocol.set_nodelay(True)
        self._lost = False
        held, self._held = self._held or [], None
        for message in held:
            self._write_message(message)

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
                    self._lost = True
                    self._fail_cells(
                        "jupyter_server lost its connection to the kernelfleet gateway while this "
                        "cell ran, so its outputs and reply cannot reach you (the cell may still "
                        "run). It reconnects if the gateway comes back: run the cell again then."
                    )
                break
            self.handle_outgoing_message(message)
        await self._reconnect_unless_closed()

    async def _reconnect_unless_closed(self) -> None:
        client = GatewayClient.instance()
        if self.disconnected:
            return
        if self.retry >= client.gateway_retry_max:
            self._give_up(client)
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

    def _give_up(self, client: GatewayClient) -> None:
        """No gateway after every reconnection attempt: fail what waits, show the kernel dead
        (JupyterLab then stops using it), close the client's websocket."""
        self.log.error(
            "The gateway at %s cannot be reached after %d attempts: kernel %s shown dead",
            client.url, self.retry, self.kernel_id,
        )  # fmt: skip
        self._fail_cells(
            f"the kernelfleet gateway at {client.url} cannot be reached (jupyter_server tried "
            f"{self.retry} times), so this cell did not run"
        )
        self._to_client(self._in_flight().status_frame("dead"))
        self.disconnected = True
        self.websocket_handler.close(1011, "the kernelfleet gateway cannot be reached")

    def _in_flight(self) -> CellsInFlight:
        if self._cells is None:
            self._cells = CellsInFlight(self.websocket_handler.selected_subprotocol)
        return self._cells

    def _fail_cells(self, why: str) -> None:
        for frame in self._in_flight().fail_all(why):
            self._to_client(frame)

    def handle_incoming_message(self, message: str | bytes) -> None:
        """Pass a client frame on to the gateway; while the gateway is lost, hold it until the
        relay reconnects (its cell fails if it never does)."""
        self._in_flight().sent(message)
        if self._lost:
            self._held = [*(self._held or []), message]
            return
        super().handle_incoming_message(message)  # type: ignore[arg-type]

    def handle_outgoing_message(self, incoming_msg: str | bytes, *args: Any) -> None:
        """Send a gateway frame to the notebook client, binary if it came binary."""
        self._in_flight().answered(incoming_msg)
        self._to_client(incoming_msg)

    def _to_client(self, incoming_msg: str | bytes) -> None:
        try:
            self.websocket_handler.write_message(
                incoming_msg, binary=isinstance(incoming_msg, bytes)
            )
        except WebSocketClosedError:
            self.log.debug("The notebook client closed its websocket; a message was dropped")

    def _write_message(self, message: str | bytes) -> None:
        """Send a client frame to the gateway, binary if it came binary."""
        if self.disconnected:
            return
        if self.ws is None:  # not open yet (its opening retries what it finds held)
            self._held = [*(self._held or []), message]
            return
        try:
            self.ws.write_message(message, binary=isinstance(message, bytes))
        except WebSocketClosedError:  # the gateway is lost; the read loop hears of it
            self._held = [*(self._held or []), message]
        except Exception as e:
            self.log.error("Exception writing message to the gateway websocket: %s", e)
