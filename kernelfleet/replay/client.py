"""A small async client of the gateway: REST calls and a kernel websocket (legacy JSON framing).

Production code for ``kernelfleet replay``; it does not depend on the test plugin. Every failure
is a `ReplayError` carrying the gateway's own message where it sent one.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from jupyter_client.session import Session
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernelfleet.errors import FleetError


class ReplayError(FleetError):
    """A call to the gateway failed; the message says which call and why, and ``status`` the
    HTTP status the gateway answered with (None when it did not answer)."""

    reason = "replay-failed"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CellTiming:
    """One cell as the client saw it, on the `time.monotonic` clock: sent, started (the
    executor's ``execute_input`` for it; the gateway's own ``busy`` while the cell waits for
    GPUs does not count), ended (its ``status: idle``), and the reply's status (``ok``,
    ``error``, ``aborted``)."""

    sent: float
    started: float
    ended: float
    status: str


class GatewayClient:
    """The gateway at `url` with `token`: kernels, the fleet admin API, kernel websockets."""

    def __init__(self, url: str, token: str, request_timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.request_timeout = request_timeout
        self._http = AsyncHTTPClient(force_instance=True, max_clients=64)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}", "Content-Type": "application/json"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call; the parsed JSON body (None if empty). `ReplayError` on any failure."""
        response = await self._fetch(method, path, body)
        return json.loads(response) if response else None

    async def _fetch(self, method: str, path: str, body: Any = None) -> bytes:
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers=self._headers(),
            body=None if body is None else json.dumps(body),
            request_timeout=self.request_timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await self._http.fetch(request)
        except HTTPClientError as error:
            message = f"{method} {path}: {_gateway_message(error)}"
            raise ReplayError(message, status=error.code) from None
        except (TimeoutError, OSError) as error:
            raise ReplayError(f"{method} {path}: cannot reach {self.url}: {error}") from None
        return bytes(response.body or b"")

    async def start_kernel(self, gpus: int, name: str = "") -> str:
        """``POST /api/kernels`` with ``KERNEL_GPUS``; the new kernel's id."""
        body: dict[str, Any] = {"env": {"KERNEL_GPUS": str(gpus)}}
        if name:
            body["name"] = name
        return str((await self.call("POST", "/api/kernels", body))["id"])

    async def delete_kernel(self, kernel_id: str) -> None:
        await self.call("DELETE", f"/api/kernels/{kernel_id}")

    async def hosts(self) -> list[dict[str, Any]]:
        """``GET /api/fleet/hosts``: ``[{"id", "state", "gpus": {"total", ...}}]``."""
        return list(await self.call("GET", "/api/fleet/hosts"))

    async def kernels(self) -> list[dict[str, Any]]:
        """``GET /api/fleet/kernels``: ``[{"id", "replicas": [{"host", ...}], ...}]``."""
        return list(await self.call("GET", "/api/fleet/kernels"))

    async def fleet(self) -> dict[str, Any] | None:
        """``GET /api/fleet``: ``{"version", "policy", "replicas", "hosts", "gpus", "kernels"}``;
        None from a gateway older than that endpoint (404). Any other failure raises."""
        try:
            found = await self.call("GET", "/api/fleet")
        except ReplayError as error:
            if error.status == 404:
                return None
            raise
        if not isinstance(found, dict):
            raise ReplayError(f"GET /api/fleet: expected a JSON object, got {found!r:.80}")
        return found

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` (Prometheus text): every sample's value by its name and labels as
        the text writes them (``kernelfleet_scale_out_hosts_total``,
        ``kernelfleet_migrations_total{outcome="succeeded"}``)."""
        text = (await self._fetch("GET", "/metrics")).decode("utf-8", "replace")
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError as error:
            raise ReplayError(f"GET /metrics: not Prometheus text: {error}") from None
        return {
            _sample_key(sample.name, sample.labels): float(sample.value)
            for family in families
            for sample in family.samples
        }

    async def connect(self, kernel_id: str) -> KernelChannel:
        """A websocket to the kernel's channels."""
        ws_url = self.url.replace("http", "ws", 1) + (
            f"/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        )
        request = HTTPRequest(ws_url, headers=self._headers(), request_timeout=self.request_timeout)
        try:
            ws = await websocket_connect(request)
        except HTTPClientError as error:
            message = _gateway_message(error)
            raise ReplayError(f"websocket of kernel {kernel_id}: {message}") from None
        except OSError as error:
            raise ReplayError(f"websocket of kernel {kernel_id}: {error}") from None
        return KernelChannel(ws)

    def close(self) -> None:
        self._http.close()


class KernelChannel:
    """One kernel's websocket. `execute` runs one cell at a time (a notebook's discipline)."""

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.session = Session(username="kernelfleet-replay")

    async def execute(
        self, code: str, metadata: dict[str, Any] | None = None, timeout: float = 60.0
    ) -> CellTiming:
        """Send an ``execute_request``; return once its reply and ``status: idle`` arrived.
        `ReplayError` if that takes over `timeout` seconds or the websocket closes."""
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        msg = self.session.msg("execute_request", content=content, metadata=metadata or {})
        msg_id = msg["header"]["msg_id"]
        self.ws.write_message(json.dumps({**msg, "channel": "shell", "buffers": []}, default=str))
        sent = time.monotonic()
        started: float | None = None
        idle: float | None = None
        status: str | None = None
        deadline = sent + timeout
        while status is None or idle is None:
            received = await self._receive(deadline)
            if received.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = received["header"]["msg_type"]
            state = received["content"].get("execution_state") if kind == "status" else None
            if state == "dead":
                raise ReplayError("the kernel died during the cell")
            if started is None and kind == "execute_input":
                started = time.monotonic()  # not "busy": the gateway says busy while a cell waits
            elif state == "idle":
                idle = time.monotonic()
            elif kind == "execute_reply":
                status = str(received["content"].get("status", "ok"))
        return CellTiming(sent, idle if started is None else started, idle, status)

    async def _receive(self, deadline: float) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ReplayError("timed out waiting for the cell's reply")
        try:
            frame = await asyncio.wait_for(self.ws.read_message(), remaining)
        except TimeoutError:
            raise ReplayError("timed out waiting for the cell's reply") from None
        if frame is None:
            raise ReplayError("the kernel's websocket closed")
        if isinstance(frame, bytes):
            from jupyter_server.services.kernels.connection.base import (
                deserialize_binary_message,
            )

            return dict(deserialize_binary_message(frame))
        return dict(json.loads(frame))

    def close(self) -> None:
        self.ws.close()


def _sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _gateway_message(error: HTTPClientError) -> str:
    """The gateway's ``{"reason", "message"}`` body as text, else the HTTP status line."""
    body = error.response.body if error.response is not None else b""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{error.code} {message}" if message else str(error)
