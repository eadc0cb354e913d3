"""Registration, heartbeat and link to the gateway.

`GatewayHeartbeat`: one idempotent ``PUT {gateway}/api/fleet/hosts/{host_id}`` whose body is the
full host report (``{"id", "instance", "address", "gpus", "replicas"}``), so the first beat
registers the host and every later one refreshes it; a gateway that restarted learns the host
again from the next beat. ``poke()`` sends the next beat at once (the replica table calls it on
every state change). A gateway that cannot be reached costs one WARNING per outage, not one per
beat; the agent keeps beating and keeps serving its own API meanwhile.

A gateway that refuses the agent says so once, as an ERROR, and the agent keeps trying (it
exits only when told to): a wrong token (401) until the agent is restarted with the right one,
and another live agent registered under the same host id (409, naming that agent's address)
until that one is lost, when this one takes the host over. Meanwhile it runs no kernel for the
gateway, and the other agent's replicas are left alone.

`GatewayLink`: once registered, the agent keeps a websocket open to the gateway
(``/api/fleet/hosts/{host_id}/link``) whose close tells the gateway at once that the agent is
gone (`kernelfleet.gateway.handlers.host_link`); it reconnects whenever the beats succeed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, WebSocketError, websocket_connect

log = logging.getLogger("kernelfleet.host.heartbeat")


class GatewayHeartbeat:
    """Sends ``report()`` to the gateway every ``interval`` seconds, and at once after ``poke()``.

    ``run()`` is the loop (one task, started by the agent, ended with ``stop()``). Beats never
    overlap: a poke during a beat makes the next beat start as soon as that one finishes.
    """

    def __init__(
        self,
        gateway_url: str,
        token: str,
        host_id: str,
        report: Callable[[], dict[str, Any]],
        interval: float,
        request_timeout: float = 5.0,
    ) -> None:
        self.url = f"{gateway_url.rstrip('/')}/api/fleet/hosts/{quote(host_id, safe='')}"
        self._token = token
        self._report = report
        self.interval = interval
        self.request_timeout = request_timeout
        self._wake = asyncio.Event()
        self._stopped = False
        self._failing_since: float | None = None
        self._failed_beats = 0
        self.beats_sent = 0
        self.registered = asyncio.Event()
        """Set while the gateway takes the beats (the link waits for it)."""

    def poke(self) -> None:
        """Ask for a beat now (safe to call from any code running on the agent's event loop)."""
        self._wake.set()

    def stop(self) -> None:
        """End ``run()`` after the beat in flight, if any; no beat is sent after this."""
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        client = AsyncHTTPClient(force_instance=True)
        try:
            while not self._stopped:
                self._wake.clear()
                await self._beat(client)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
        finally:
            client.close()

    async def _beat(self, client: AsyncHTTPClient) -> None:
        try:
            body = json.dumps(self._report())
        except Exception:
            log.exception("could not build the host report; skipping this heartbeat")
            return
        request = HTTPRequest(
            self.url,
            method="PUT",
            headers={
                "Authorization": f"token {self._token}",
                "Content-Type": "application/json",
            },
            body=body,
            connect_timeout=self.request_timeout,
            request_timeout=self.request_timeout,
        )
        try:
            await client.fetch(request)
        except HTTPClientError as e:
            self._failed(_describe_http_error(e), refused=e.code in (401, 403, 409))
        except OSError as e:
            self._failed(f"{type(e).__name__}: {e}")
        else:
            self._succeeded()

    def _failed(self, why: str, refused: bool = False) -> None:
        self._failed_beats += 1
        self.registered.clear()
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            if refused:
                log.error(
                    "the gateway at %s refuses this agent (%s); trying again every %.1f s",
                    self.url,
                    why,
                    self.interval,
                )
                return
            log.warning(
                "cannot reach the gateway at %s (%s); retrying every %.1f s and serving meanwhile",
                self.url,
                why,
                self.interval,
            )
        else:
            log.debug("heartbeat to %s failed again: %s", self.url, why)

    def _succeeded(self) -> None:
        self.beats_sent += 1
        self.registered.set()
        if self._failing_since is not None:
            log.info(
                "the gateway at %s answers again, after %.1f s and %d failed heartbeat(s)",
                self.url,
                time.monotonic() - self._failing_since,
                self._failed_beats,
            )
        elif self.beats_sent == 1:
            log.info("registered with the gateway at %s", self.url)
        self._failing_since = None
        self._failed_beats = 0


class GatewayLink:
    """Keeps the agent's link to the gateway open while `heartbeat` is registered.

    ``run()`` is the loop (one task, ended with ``stop()``): wait until the beats succeed,
    connect, hold the connection (the websocket client answers the gateway's pings by itself)
    until it closes, wait `retry` seconds, again. A refused link (the gateway restarted and has
    not taken a beat yet, say) is retried quietly; the heartbeat reports what is wrong.
    """

    def __init__(
        self,
        heartbeat: GatewayHeartbeat,
        token: str,
        instance: str,
        retry: float = 1.0,
        connect_timeout: float = 5.0,
    ) -> None:
        base = heartbeat.url.replace("http", "ws", 1)
        self.url = f"{base}/link?instance={quote(instance, safe='')}"
        self._heartbeat = heartbeat
        self._token = token
        self.retry = retry
        self.connect_timeout = connect_timeout
        self._connection: WebSocketClientConnection | None = None
        self._stopped = False
        self.links_opened = 0

    def stop(self) -> None:
        """Close the link and end ``run()``."""
        self._stopped = True
        if self._connection is not None:
            self._connection.close()

    async def run(self) -> None:
        while not self._stopped:
            await self._heartbeat.registered.wait()
            if self._stopped:
                return
            request = HTTPRequest(
                self.url,
                headers={"Authorization": f"token {self._token}"},
                connect_timeout=self.connect_timeout,
                request_timeout=self.connect_timeout,
            )
            try:
                self._connection = await websocket_connect(request)
            except (HTTPClientError, WebSocketError, OSError) as e:
                log.debug("could not open the link to the gateway: %s", e)
            else:
                self.links_opened += 1
                log.info("linked to the gateway: it sees this agent's loss at once")
                while await self._connection.read_message() is not None:
                    pass  # the gateway sends nothing; pings are answered by the client
                self._connection = None
                if not self._stopped:
                    log.warning("the link to the gateway closed; opening it again")
            with contextlib.suppress(TimeoutError):
                await asyncio.sleep(self.retry)


def _describe_http_error(error: HTTPClientError) -> str:
    if error.code == 599 or error.response is None:
        return str(error)
    try:
        body = json.loads(error.response.body or b"")
        return f"HTTP {error.code} {body.get('reason')}: {body.get('message')}"
    except (ValueError, AttributeError):
        return f"HTTP {error.code}"
