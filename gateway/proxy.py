"""GatewayProxy: one TCP address that always reaches the gateway member that serves.

A replicated gateway is a Raft group of ``kernelfleet gateway`` members: the leader serves the
full API, the standbys answer every request with 503. The proxy probes every member each
``probe_interval`` with ``GET {member}/api/fleet/serving`` (the fleet token in the
``Authorization`` header) and forwards each connection it accepts, byte for byte, to the member
that serves. It holds no state of its own: any number of proxies may front the same members.

The probe's contract (the member's side of it is the gateway's ``/api/fleet/serving``):

- the member that serves answers 200 with ``{"serving": true, "term": <int>, "member": <url>}``;
- a standby answers 503 with ``{"reason": "not-serving", "message": ..., "serving": <url|null>}``;
- a dead member does not answer (refused, or no answer within ``probe_timeout``).

A member serves iff it answers 200 with ``serving`` true; the member already served keeps
serving through probes that time out, unless another claims a later term (a stalled loop is
not a failover). When two claim to serve (a brief
overlap during a failover), the one with the higher ``term`` wins; on equal terms the member
already forwarded to stays, else the first in ``members`` order.

When the serving member changes, or none serves any more, every open connection to the old one
is closed (both ends), so long-lived websockets reconnect and land on the new member. A
connection accepted while none serves waits up to ``connect_wait`` for one; after that it gets
a minimal ``HTTP/1.1 503`` answer with the JSON body
``{"reason": "no-serving-gateway", "message": ...}`` and is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError

log = logging.getLogger("kernelfleet.gateway.proxy")

SERVING_PATH = "/api/fleet/serving"
"""The path every member answers the probe on."""
CHUNK = 64 * 1024
"""Bytes read at once from either end of a forwarded connection."""
LINGER_S = 1.0
"""Seconds the 503 answer waits for the client to close first, so that the client's unread
request does not turn the close into a reset that could destroy the answer."""
PROBE_ANSWER_BYTES = 64 * 1024
"""The largest probe answer read; a member's is a few dozen bytes."""


@dataclass(frozen=True)
class Claim:
    """What one probe found: a member that serves, in `term`."""

    member: str
    term: int


def member_address(url: str) -> tuple[str, int]:
    """(host, port) that a member URL's connections go to: its port, else 80 or 443."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        raise ValueError(f"{url!r} names no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def choose(claims: Sequence[Claim], current: str | None) -> Claim | None:
    """The claim to forward to: the highest term; on a tie `current` if it is among them, else
    the first. None when nothing claims to serve."""
    if not claims:
        return None
    top = max(claim.term for claim in claims)
    tied = [claim for claim in claims if claim.term == top]
    return next((claim for claim in tied if claim.member == current), tied[0])


def no_serving_answer(members: Sequence[str], waited: float) -> bytes:
    """The whole HTTP/1.1 503 answer a client gets when no member serves within `waited` s."""
    body = json.dumps(
        {
            "reason": "no-serving-gateway",
            "message": f"none of the gateway members ({', '.join(members)}) serves: "
            f"waited {waited:g} s for one to be elected; try again",
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json; charset=UTF-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass(eq=False)
class _Link:
    """One forwarded connection: the client's end and the member's."""

    member: str
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter

    def close(self) -> None:
        """Close both ends now: the member's at once (it may be gone), the client's after what
        it was already sent."""
        self.upstream.transport.abort()
        self.client.close()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until end of file, then half-close `writer`. Raises
    ``OSError`` (a reset) when either end breaks."""
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    if not writer.is_closing() and writer.can_write_eof():
        writer.write_eof()


class GatewayProxy:
    """Forwards TCP connections to the member of `members` that serves (module docstring).

    `start` binds and starts probing; `close` stops both and closes every connection. Not
    reusable after `close`. `serving` is the member connections go to now, or None.
    """

    def __init__(
        self,
        members: Sequence[str],
        token: str,
        probe_interval: float = 0.25,
        probe_timeout: float = 1.0,
        connect_wait: float = 10.0,
    ) -> None:
        if not members:
            raise ValueError("a gateway proxy needs at least one member")
        self.members = [member.rstrip("/") for member in members]
        self.token = token
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.connect_wait = connect_wait
        self.serving: str | None = None
        self.term: int | None = None
        self.rounds = 0
        """Probe rounds decided so far."""
        self._decided = asyncio.Condition()
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._prober: asyncio.Task[None] | None = None
        self._http: AsyncHTTPClient | None = None
        self._refused: set[str] = set()
        """Members whose last answer refused the token (warned about once)."""
        self._silent: set[str] = set()
        """Members whose probe of this round timed out (no answer, no refusal)."""

    async def start(self, host: str, port: int) -> int:
        """Listen on `host`:`port` (0: a free port) and start probing; returns the bound port."""
        self._http = AsyncHTTPClient(force_instance=True)
        self._server = await asyncio.start_server(self._accept, host, port)
        self._prober = asyncio.create_task(self._probe_rounds())
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        """Stop listening and probing, and close every connection, forwarded or waiting."""
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()
        for handler in list(self._handlers):
            handler.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._http is not None:
            self._http.close()

    # probing

    async def _probe_rounds(self) -> None:
        """Probe every member at once, decide, wake the connections that wait for a decision;
        again after `probe_interval`, until cancelled. A round that fails is logged, and the
        next one runs: without rounds no connection would ever be forwarded."""
        while True:
            try:
                self._silent.clear()
                found = await asyncio.gather(*(self._probe(member) for member in self.members))
                claims = [claim for claim in found if claim is not None]
                if self.serving in self._silent and self.term is not None:
                    claims.append(Claim(self.serving, self.term))  # slow, not gone: see _decide
                self._decide(claims)
                async with self._decided:
                    self._decided.notify_all()
            except Exception:
                log.exception("a probe round failed")
            await asyncio.sleep(self.probe_interval)

    async def _probe(self, member: str) -> Claim | None:
        """The member's claim to serve, or None (a standby, dead, or an unexpected answer)."""
        assert self._http is not None
        request = HTTPRequest(
            member + SERVING_PATH,
            headers={"Authorization": f"token {self.token}"},
            connect_timeout=self.probe_timeout,
            request_timeout=self.probe_timeout,
            follow_redirects=False,
        )
        try:
            response = await self._http.fetch(request, raise_error=False)
        except HTTPTimeoutError as e:
            log.debug("probe of %s: no answer in %g s (%s)", member, self.probe_timeout, e)
            self._silent.add(member)
            return None
        except Exception as e:  # refused, TLS...: no claim, and the rounds go on
            log.debug("probe of %s: no answer (%s)", member, e)
            return None
        self._note_refusal(member, response.code)
        if response.code != 200:
            return None
        try:
            answer = json.loads(response.body[:PROBE_ANSWER_BYTES])
            if answer.get("serving") is True and isinstance(answer.get("term"), int):
                return Claim(member, answer["term"])
        except (ValueError, AttributeError):
            pass
        log.warning("probe of %s: 200 without serving true and an integer term", member)
        return None

    def _note_refusal(self, member: str, code: int) -> None:
        """Warn, once per member until it accepts again, that it refuses the proxy's token."""
        if code in (401, 403):
            if member not in self._refused:
                log.warning(
                    "member %s refuses the proxy's token (%d): is --token right?", member, code
                )
            self._refused.add(member)
        else:
            self._refused.discard(member)

    def _decide(self, claims: Sequence[Claim]) -> None:
        """Take this round's claims: on a change of member, log it and close every connection
        to the old one. The member served so far counts as still claiming its term when its
        probe timed out (a gateway whose loop stalls for a second must not lose every
        websocket): only a claim of a later term, a refusal or a 503 moves the proxy off it."""
        chosen = choose(claims, self.serving)
        member = None if chosen is None else chosen.member
        first = self.rounds == 0
        self.rounds += 1
        if member != self.serving or first:
            if chosen is None:
                log.warning("no member serves (members: %s)", ", ".join(self.members))
            else:
                log.info("forwarding to %s (term %d)", chosen.member, chosen.term)
            stale = [link for link in self._links if link.member != member]
            if stale:
                log.info("closing %d connection(s) to %s", len(stale), self.serving)
            for link in stale:
                link.close()
        self.serving, self.term = member, None if chosen is None else chosen.term

    # forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _no_delay(writer)
        connected = await self._connect()
        if connected is None:
            await self._refuse(reader, writer)
            return
        member, upstream_reader, upstream = connected
        _no_delay(upstream)
        link = _Link(member, writer, upstream)
        self._links.add(link)
        pipes = [
            asyncio.create_task(_pipe(reader, upstream)),
            asyncio.create_task(_pipe(upstream_reader, writer)),
        ]
        try:
            # both directions to their end of file, or the first to break
            await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self._links.discard(link)
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            link.close()

    async def _connect(
        self,
    ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the serving member, waiting up to `connect_wait` for one to serve
        (and, when it refuses the connection, for the next probe round); None at the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_wait
        after_round = -1
        while (remaining := deadline - loop.time()) > 0:
            try:
                async with self._decided:
                    await asyncio.wait_for(
                        self._decided.wait_for(functools.partial(self._decided_since, after_round)),
                        remaining,
                    )
            except TimeoutError:
                return None
            member, after_round = self.serving, self.rounds
            assert member is not None
            host, port = member_address(member)
            try:
                upstream = await asyncio.wait_for(
                    asyncio.open_connection(host, port),
                    max(0.0, min(self.probe_timeout, deadline - loop.time())),
                )
            except (OSError, TimeoutError) as e:
                log.info("cannot reach %s (%s): waiting for the next probe round", member, e)
                continue
            if self.serving == member:
                return member, *upstream
            upstream[1].transport.abort()  # it stopped serving meanwhile
        return None

    def _decided_since(self, rounds: int) -> bool:
        """Whether a member serves, as decided by a round after the first `rounds`."""
        return self.serving is not None and self.rounds > rounds

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the 503 of `no_serving_answer`, then close once the client has (or after
        `LINGER_S`), discarding what it sent."""
        with contextlib.suppress(OSError):
            writer.write(no_serving_answer(self.members, self.connect_wait))
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._discard(reader), LINGER_S)

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        while await reader.read(CHUNK):
            pass
