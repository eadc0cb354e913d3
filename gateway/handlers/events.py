"""The fleet events: ``GET /api/fleet/events`` (the recent ones) and the live stream.

``GET /api/fleet/events?kernel=ID&n=N``: the last N kept events (default 50, at most 1000),
oldest first; with ``kernel``, only that kernel's. ``GET /api/fleet/events/stream?kernel=ID&
since=SEQ`` is a websocket: one JSON text message per event, first the kept events after SEQ
(if ``since`` is given), then live ones (`kernelfleet.gateway.events`). The token and the
arguments are checked before the upgrade, so a wrong one gets a JSON error, not a websocket.
A ``kernel`` that the gateway does not run is 404 `not-found`.

A kernel's own token may read both, but only its own events: its filter is forced to its
kernel, and naming another kernel is 403 `forbidden`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.events import EventBus, Subscription
from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.web import JsonErrorsMixin, KernelAccess, TokenAuthMixin

log = logging.getLogger("kernelfleet.gateway.events")

DEFAULT_EVENTS = 50
MAX_EVENTS = 1000


class EventArguments:
    """What both endpoints read from the query: the kernel filter, checked against the
    kernels the gateway runs. `kernel_filter` is the one place a caller's filter is read."""

    settings: dict[str, Any]
    get_query_argument: Any
    kernel_principal: str | None
    kernel_access: ClassVar[Mapping[str, KernelAccess]] = {"GET": KernelAccess.ANY}

    @property
    def events(self) -> EventBus:
        return self.settings["events"]

    def kernel_filter(self) -> str | None:
        """The ``kernel`` argument; `NotFound` if the gateway runs no such kernel. For a
        kernel's token, always its own kernel (403 if it names another)."""
        kernel_id = self.get_query_argument("kernel", None) or None
        if self.kernel_principal is not None:
            if kernel_id not in (None, self.kernel_principal):
                raise web.HTTPError(403, "a kernel token may read only its own kernel's events")
            kernel_id = self.kernel_principal
        if kernel_id is not None:
            self.settings["kernel_service"].get(kernel_id)
        return kernel_id

    def int_argument(self, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
            raise InvalidRequest(f"'{name}' must be an integer from {low} to {high}, not {raw!r}")
        return int(raw)


class FleetEventsHandler(EventArguments, GatewayHandler):
    def get(self) -> None:
        kernel_id = self.kernel_filter()
        n = self.int_argument("n", DEFAULT_EVENTS, 1, MAX_EVENTS)
        assert n is not None
        self.write_json(self.events.recent(n, kernel_id))


class FleetEventsStreamHandler(EventArguments, TokenAuthMixin, JsonErrorsMixin, WebSocketHandler):
    """The live stream. A client too slow to take what is sent loses events (it is told how
    many, with an ``events-missed`` event), never the gateway's time."""

    subscription: Subscription | None = None
    _pump: asyncio.Task[None] | None = None

    def check_origin(self, origin: str) -> bool:
        # Callers are Jupyter servers and scripts, not browsers; the token is what authenticates.
        return True

    async def get(self, *args: Any, **kwargs: Any) -> None:
        self.check_token()
        self.kernel_id = self.kernel_filter()
        self.since = self.int_argument("since", None, 0, 2**63 - 1)
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise web.HTTPError(
                400, "this endpoint is a websocket: connect with 'Upgrade: websocket'"
            )
        await super().get(*args, **kwargs)

    def open(self) -> None:
        self.set_nodelay(True)
        self.subscription = self.events.subscribe(self.kernel_id, self.since)
        self._pump = asyncio.create_task(self._send(self.subscription))
        log.info("event stream opened (kernel %s, since %s)", self.kernel_id, self.since)

    async def _send(self, subscription: Subscription) -> None:
        async for event in subscription:
            try:
                await self.write_message(json.dumps(event))
            except WebSocketClosedError:
                break
        subscription.close()

    def on_message(self, message: str | bytes) -> None:
        pass  # nothing is read from the client

    def on_close(self) -> None:
        if self.subscription is not None:
            self.subscription.close()
            self.subscription = None
        if self._pump is not None:
            self._pump.cancel()
        log.info("event stream closed (kernel %s)", getattr(self, "kernel_id", None))
