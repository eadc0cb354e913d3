"""A host agent's link: ``GET /api/fleet/hosts/{host_id}/link?instance=ID`` (a websocket).

A registered agent keeps this websocket open to tell the gateway at once that it is gone
(`kernelfleet.gateway.hosts`, "How a lost host is seen"). Nothing is exchanged but pings: the
gateway pings every `LINK_PING_INTERVAL` seconds, and the agent's websocket client answers
them without its code doing anything. The host is LOST (`HostRegistry.link_closed`) when

- the connection closes: the agent process died, or exited (the kernel of a host killed
  outright closes its sockets, so this is seen within milliseconds);
- no pong came for `LINK_PING_TIMEOUT` seconds: the host stopped (SIGSTOP, a frozen VM) or its
  network is cut. The gateway does not wait for a closing handshake that cannot come.

False alarms: a pause of the gateway's own loop longer than `LINK_STALL` (a busy machine, a
slow collection) restarts the pong clock, since the agent could not be heard meanwhile. An
agent whose own loop stalls past the timeout is taken for lost; its next heartbeat brings it
back, and the replicas it still runs, replaced meanwhile, are stopped (`HostReconciler`).

The fleet token and the instance are checked before the upgrade: a wrong token is 401 (logged
once per agent), an unregistered host 404, another agent's instance 409, as JSON.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from kernelfleet.errors import FleetError
from kernelfleet.gateway.hosts import HostRegistry
from kernelfleet.web import JsonErrorsMixin, is_kernel_token, token_from_request, token_matches

log = logging.getLogger("kernelfleet.gateway.hosts")

LINK_PING_INTERVAL = 0.5
"""Seconds between two pings the gateway sends on a host link."""
LINK_PING_TIMEOUT = 2.0
"""Seconds without a pong after which a linked host is lost."""
LINK_STALL = 0.5
"""A tick of the ping loop this much later than due means the gateway itself stalled: the pong
clock starts again rather than blaming the agent."""


class HostLinkHandler(JsonErrorsMixin, WebSocketHandler):
    """One agent's link; see the module docstring."""

    host_id = ""
    _link: int | None = None
    _pinger: asyncio.Task[None] | None = None
    _last_pong = 0.0

    @property
    def hosts(self) -> HostRegistry:
        return self.settings["host_registry"]

    def check_origin(self, origin: str) -> bool:
        return True  # agents are not browsers; the token authenticates

    async def get(self, *args: Any, **kwargs: Any) -> None:
        self.host_id = kwargs["host_id"]
        presented = token_from_request(self.request)
        if is_kernel_token(presented):
            raise web.HTTPError(403, "a kernel's token may not link a host")
        if not token_matches(presented, self.settings["token"]):
            self.hosts.refuse_token(self.host_id, self.request.remote_ip or "?")
            raise web.HTTPError(401, "not the fleet token: start the agent with the gateway's")
        self.instance = self.get_query_argument("instance", "")
        self.hosts.check_link(self.host_id, self.instance)
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise web.HTTPError(400, "a websocket: connect with 'Upgrade: websocket'")
        await super().get(*args, **kwargs)

    def open(self, *args: Any, **kwargs: Any) -> None:
        try:
            self._link = self.hosts.link_opened(self.host_id, self.instance)
        except FleetError as e:  # the host was forgotten or re-registered during the upgrade
            log.warning("host %s: link refused: %s", self.host_id, e)
            self.close(4009, str(e))
            return
        loop = asyncio.get_running_loop()
        self._last_pong = loop.time()
        self._pinger = asyncio.create_task(self._ping(loop))

    def on_pong(self, data: bytes) -> None:
        self._last_pong = asyncio.get_running_loop().time()

    async def _ping(self, loop: asyncio.AbstractEventLoop) -> None:
        due = loop.time()
        while True:
            due += LINK_PING_INTERVAL
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            if now - due > LINK_STALL:  # the gateway stalled: the agent could not be heard
                log.debug("host %s link: the gateway stalled %.2f s", self.host_id, now - due)
                self._last_pong, due = now, now
            if now - self._last_pong > LINK_PING_TIMEOUT:
                self._broken(f"it answered no ping for {now - self._last_pong:.1f} s")
                self.close(4000, "no pong")
                return
            try:
                self.ping()
            except WebSocketClosedError:
                return

    def on_message(self, message: str | bytes) -> None:
        pass  # agents send nothing

    def on_close(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        self._broken("its agent's connection to the gateway closed (the agent is gone)")

    def _broken(self, why: str) -> None:
        if self._link is not None:
            self.hosts.link_closed(self.host_id, self._link, why)
            self._link = None
