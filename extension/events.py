"""``GET {base_url}kernelfleet/api/events?kernel=ID&since=SEQ``: the fleet's event stream,
proxied to the browser and filtered to what this jupyter_server's user may see.

Before the handshake, the handler checks jupyter_server's authentication and that the user may
read ``kernels``, and opens the gateway's ``/api/fleet/events/stream`` with the gateway token
(passing ``kernel`` and ``since`` on). If that fails, the handshake is refused with the JSON error
the REST routes give (409 ``not-kernelfleet``, 404 ``not-found`` for a ``kernel`` that is not this
server's, 502 ``gateway-unreachable`` naming the URL). Once open, each gateway event (one JSON
text message) is relayed unchanged if its ``kernel_id`` is null (fleet-wide: hosts, the
autoscaler) or a kernel in this server's kernel manager at that moment; others are dropped.

When the gateway's stream ends (the gateway stopped or went away), the browser's socket is closed
with code 1011 and reason ``gateway-unreachable``; the browser reconnects with ``since`` set to the
last ``seq`` it saw, so it misses nothing the gateway still holds. Messages from the browser are
ignored.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, WebSocketHandler

from kernelfleet.errors import FleetError, InvalidRequest
from kernelfleet.extension.gateway_api import gateway, open_events
from kernelfleet.extension.handlers import AUTH_RESOURCE, status_for, visible_kernel

GATEWAY_GONE = 1011
"""Close code sent to the browser when the gateway's stream ends."""


class EventsHandler(WebSocketMixin, WebSocketHandler, JupyterHandler):
    auth_resource = AUTH_RESOURCE
    upstream: WebSocketClientConnection | None = None
    relay: asyncio.Task[None] | None = None

    def set_default_headers(self) -> None:
        """No JupyterHandler security headers on a websocket upgrade."""

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "read", AUTH_RESOURCE)):
            raise web.HTTPError(403)
        kernel_id = self.get_argument("kernel", None) or None
        try:
            since = self._since()
            gateway()
            if kernel_id is not None:
                visible_kernel(self, kernel_id)
            self.upstream = await open_events(kernel_id, since)
        except FleetError as error:
            self.set_status(status_for(error))
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"reason": error.reason, "message": error.message}))
            return
        await super().get(*args, **kwargs)

    def _since(self) -> int | None:
        since = self.get_argument("since", None)
        if since is None or since == "":
            return None
        try:
            return int(since)
        except ValueError:
            raise InvalidRequest(
                f"'since' must be an event seq (an integer), not {since!r}"
            ) from None

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)  # WebSocketMixin: the ping loop
        self.relay = asyncio.ensure_future(self._relay())

    def visible(self, event: dict[str, Any]) -> bool:
        kernel_id = event.get("kernel_id")
        return kernel_id is None or kernel_id in self.kernel_manager

    async def _relay(self) -> None:
        upstream = self.upstream
        while upstream is not None:
            message = await upstream.read_message()
            if message is None:
                break
            try:
                event = json.loads(message)
            except ValueError:
                self.log.warning("kernelfleet: dropped a non-JSON gateway event")
                continue
            if not isinstance(event, dict) or not self.visible(event):
                continue
            try:
                await self.write_message(message if isinstance(message, str) else message.decode())
            except WebSocketClosedError:
                return
        if self.ws_connection is not None:
            self.log.warning("kernelfleet: the gateway's event stream ended")
            self.close(GATEWAY_GONE, "gateway-unreachable")

    def on_message(self, message: str | bytes) -> None:
        """The stream is one-way: nothing from the browser is acted on."""

    def on_close(self) -> None:
        if self.relay is not None:
            self.relay.cancel()
        if self.upstream is not None:
            self.upstream.close()
