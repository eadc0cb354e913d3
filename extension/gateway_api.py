"""The server extension's calls to the kernelfleet gateway, made server-side.

The browser never holds the gateway token: every call here goes out with what jupyter_server's
`GatewayClient` was configured with (its ``url``, ``ws_url`` and ``auth_token``, through
``load_connection_args``). Failures come back as domain errors that the handlers map to HTTP:

- `GatewayUnreachable` (502 ``gateway-unreachable``): nothing answered at the gateway's URL, or
  it timed out. The message names the URL. Nothing is cached, so the next call tries again and
  recovers by itself once the gateway is back.
- `GatewayAnswered` (the gateway's own status and ``{"reason", "message"}``): it answered with an
  error, which is passed on as it is.
- `NotKernelfleet` (409 ``not-kernelfleet``): this jupyter_server does not run in gateway mode.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from jupyter_server.gateway.gateway_client import GatewayClient
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernelfleet.errors import FleetError

REQUEST_TIMEOUT_S = 10.0
"""How long one admin call may take: the panel would rather say "unreachable" than hang."""


class GatewayUnreachable(FleetError):
    """Nothing answered at the gateway's URL (refused, reset, timed out)."""

    reason = "gateway-unreachable"


class NotKernelfleet(FleetError):
    """This jupyter_server runs its kernels itself: there is no fleet to show."""

    reason = "not-kernelfleet"


class GatewayAnswered(FleetError):
    """The gateway answered with an error status; `status`, `reason` and `message` are its own."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message, reason=reason)
        self.status = status


def gateway() -> GatewayClient:
    """The server's configured `GatewayClient`; `NotKernelfleet` when gateway mode is off."""
    client = GatewayClient.instance()
    if not client.gateway_enabled:
        raise NotKernelfleet(
            "this Jupyter server runs its kernels itself (no --gateway-url), not on a kernelfleet"
        )
    return client


def _request(url: str, **kwargs: Any) -> HTTPRequest:
    args = gateway().load_connection_args(**kwargs)
    args["request_timeout"] = min(args.get("request_timeout") or REQUEST_TIMEOUT_S, 60.0)
    args["connect_timeout"] = min(args.get("connect_timeout") or REQUEST_TIMEOUT_S, 60.0)
    return HTTPRequest(url, **args)


async def get_json(path: str, **query: str) -> Any:
    """``GET`` an admin API path (``/api/fleet/...``) on the gateway and decode its JSON."""
    client = gateway()
    url = (client.url or "").rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
    try:
        response = await AsyncHTTPClient().fetch(_request(url, method="GET"))
    except HTTPClientError as error:
        if error.response is None:  # tornado's own timeout (599): no answer at all
            raise GatewayUnreachable(unreachable(client.url, error)) from error
        raise _answered(error.code, error.response.body) from error
    except OSError as error:  # refused, reset, name not resolved
        raise GatewayUnreachable(unreachable(client.url, error)) from error
    return json.loads(response.body)


async def open_events(kernel_id: str | None, since: int | None) -> WebSocketClientConnection:
    """Open the gateway's fleet event stream (``/api/fleet/events/stream``), optionally only
    one kernel's events, starting after event ``since``."""
    client = gateway()
    base = (client.ws_url or "").rstrip("/")
    query = {k: str(v) for k, v in (("kernel", kernel_id), ("since", since)) if v is not None}
    url = base + "/api/fleet/events/stream" + (f"?{urlencode(query)}" if query else "")
    try:
        return await websocket_connect(_request(url))
    except HTTPClientError as error:
        if error.response is None:
            raise GatewayUnreachable(unreachable(client.url, error)) from error
        raise _answered(error.code, error.response.body) from error
    except OSError as error:
        raise GatewayUnreachable(unreachable(client.url, error)) from error


def unreachable(url: str | None, error: BaseException) -> str:
    return f"the kernelfleet gateway at {url} is unreachable: {error}"


def _answered(status: int, body: bytes | None) -> GatewayAnswered:
    try:
        error = json.loads(body or b"{}")
        return GatewayAnswered(status, str(error["reason"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return GatewayAnswered(status, "gateway-error", f"the gateway answered {status}")
