"""The gateway proxy: one address that reaches whichever gateway member serves.

The members here are in-process tornado apps that keep the member's side of the probe contract
(`kernelfleet.gateway.proxy`); besides it, each answers ``GET /who`` and echoes on the
websocket ``/echo`` with its name, so that a test sees which member a connection reached. A
standby of the real gateway answers 503 to everything; these answer ``/who`` anyway, so that a
request sent to a standby would show.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import tornado.netutil
from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler
from tornado.websocket import WebSocketHandler, websocket_connect

from kernelfleet.gateway.proxy import GatewayProxy
from kernelfleet.gateway.proxy_app import GatewayProxyApp
from kernelfleet.runtime_file import GatewayRuntime, read_runtime
from kernelfleet.testing import free_port, wait_until

TOKEN = "proxy-test-token"
FAST = {"probe_interval": 0.02, "probe_timeout": 0.5}
WITHIN = 3.0
"""Seconds a test waits for what should happen within a few probe rounds."""


class FakeMember:
    """A gateway member as the proxy sees it: serving or standby, in a term."""

    def __init__(self, name: str, serving: bool = False, term: int = 1) -> None:
        self.name = name
        self.serving = serving
        self.term = term
        self.stall = 0.0
        """Seconds its probe answers wait (a gateway whose loop is stalled)."""
        self.probes: list[str | None] = []
        """The Authorization header of every probe, as received."""
        self.requests = 0
        """``/who`` requests and websockets it got."""
        self.url = ""
        self._server: HTTPServer | None = None

    def start(self) -> FakeMember:
        app = Application(
            [
                (r"/api/fleet/serving", ServingHandler, {"member": self}),
                (r"/who", WhoHandler, {"member": self}),
                (r"/echo", EchoHandler, {"member": self}),
            ]
        )
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self._server = HTTPServer(app)
        self._server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()


class ServingHandler(RequestHandler):
    """``/api/fleet/serving``: 403 without the token, 200 serving, else 503 not-serving."""

    def initialize(self, member: FakeMember) -> None:
        self.member = member

    async def get(self) -> None:
        header = self.request.headers.get("Authorization")
        self.member.probes.append(header)
        await asyncio.sleep(self.member.stall)
        self.set_header("Content-Type", "application/json")
        if header != f"token {TOKEN}":
            self.set_status(403)
            self.finish({"reason": "forbidden", "message": "the token is not valid"})
        elif self.member.serving:
            self.finish({"serving": True, "term": self.member.term, "member": self.member.url})
        else:
            self.set_status(503)
            self.finish({"reason": "not-serving", "message": "a standby", "serving": None})


class WhoHandler(RequestHandler):
    def initialize(self, member: FakeMember) -> None:
        self.member = member

    def get(self) -> None:
        self.member.requests += 1
        self.finish(self.member.name)


class EchoHandler(WebSocketHandler):
    def initialize(self, member: FakeMember) -> None:
        self.member = member

    def open(self) -> None:
        self.member.requests += 1

    def on_message(self, message: str | bytes) -> None:
        self.write_message(f"{self.member.name}:{message!s}")


@asynccontextmanager
async def members(*fakes: FakeMember) -> AsyncIterator[list[FakeMember]]:
    started = [fake.start() for fake in fakes]
    try:
        yield started
    finally:
        for fake in started:
            await fake.stop()


class Proxy(GatewayProxy):
    address = ""
    """``127.0.0.1:<port>``, where it listens."""


@asynccontextmanager
async def proxy_of(urls: list[str], **options: Any) -> AsyncIterator[Proxy]:
    proxy = Proxy(urls, **{"token": TOKEN, **FAST, **options})
    proxy.address = f"127.0.0.1:{await proxy.start('127.0.0.1', 0)}"
    try:
        yield proxy
    finally:
        await proxy.close()


def dead_url() -> str:
    """A member that does not run: nothing listens on its port."""
    return f"http://127.0.0.1:{free_port()}"


async def get(proxy: Proxy, path: str) -> HTTPResponse:
    request = HTTPRequest(f"http://{proxy.address}{path}", request_timeout=WITHIN)
    return await AsyncHTTPClient().fetch(request, raise_error=False)


async def test_requests_reach_the_serving_member_and_never_a_standby() -> None:
    async with members(FakeMember("a"), FakeMember("b", serving=True, term=3)) as (a, b):
        async with proxy_of([a.url, b.url, dead_url()]) as proxy:
            await wait_until(lambda: proxy.serving == b.url, WITHIN, "b to be forwarded to")
            for _ in range(5):
                response = await get(proxy, "/who")
                assert (response.code, response.body) == (200, b"b")
        assert (a.requests, b.requests) == (0, 5)


async def test_a_websocket_is_closed_when_the_serving_member_changes() -> None:
    async with members(FakeMember("a", serving=True, term=1), FakeMember("b")) as (a, b):
        async with proxy_of([a.url, b.url]) as proxy:
            await wait_until(lambda: proxy.serving == a.url, WITHIN, "a to be forwarded to")
            echo = f"ws://{proxy.address}/echo"
            first = await websocket_connect(echo)
            await first.write_message("hi")
            assert await first.read_message() == "a:hi"

            a.serving, b.serving, b.term = False, True, 2  # a failover
            # the proxy closes the websocket to a: it reads as the end of the stream
            assert await asyncio.wait_for(first.read_message(), WITHIN) is None

            second = await websocket_connect(echo)
            await second.write_message("hi")
            assert await second.read_message() == "b:hi"
            second.close()
        assert (a.requests, b.requests) == (1, 1)


async def half_close_member(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A serving member that answers the probe, and anything else once the client has sent
    all of it (half-closed its side): with what it got. (tornado closes on a half-close.)"""
    head = await reader.readuntil(b"\r\n\r\n")
    if head.startswith(b"GET /api/fleet/serving "):
        body = json.dumps({"serving": True, "term": 1, "member": "raw"}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    else:
        writer.write(b"got " + await reader.read())  # to the end of the client's stream
    await writer.drain()
    writer.close()


async def test_a_client_that_half_closes_still_gets_the_answer() -> None:
    server = await asyncio.start_server(half_close_member, "127.0.0.1", 0)
    member = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, proxy_of([member]) as proxy:
        host, port = proxy.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /upload HTTP/1.0\r\n\r\nall of it")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), WITHIN)
        writer.close()
    assert answer == b"got all of it"


async def test_with_no_serving_member_a_client_gets_503_after_connect_wait() -> None:
    async with members(FakeMember("a")) as (a,):
        async with proxy_of([a.url, dead_url()], connect_wait=0.3) as proxy:
            response = await get(proxy, "/who")
        assert response.code == 503
        body = json.loads(response.body)
        assert body["reason"] == "no-serving-gateway"
        assert a.url in body["message"]
        assert a.requests == 0


async def test_the_higher_term_wins_when_two_claim_to_serve() -> None:
    old, new = FakeMember("old", serving=True, term=4), FakeMember("new", serving=True, term=5)
    async with members(old, new), proxy_of([old.url, new.url]) as proxy:
        await wait_until(lambda: proxy.serving == new.url, WITHIN, "the term 5 member")
        assert (await get(proxy, "/who")).body == b"new"
        old.term = 6
        await wait_until(lambda: proxy.serving == old.url, WITHIN, "the term 6 member")
        assert (await get(proxy, "/who")).body == b"old"


async def test_a_serving_member_whose_probes_time_out_keeps_its_connections() -> None:
    first, second = FakeMember("first", serving=True, term=1), FakeMember("second")
    async with members(first, second), proxy_of([first.url, second.url]) as proxy:
        await wait_until(lambda: proxy.serving == first.url, WITHIN, "the serving member")
        ws = await websocket_connect(f"ws://{proxy.address}/echo")
        first.stall = 1.0  # over probe_timeout: its probes time out
        rounds = proxy.rounds
        await wait_until(lambda: proxy.rounds >= rounds + 3, WITHIN * 3, "three probe rounds")
        assert proxy.serving == first.url, "a slow member is not a failover"
        await ws.write_message("still")
        assert await ws.read_message() == "first:still"
        second.serving, second.term = True, 2
        await wait_until(lambda: proxy.serving == second.url, WITHIN * 3, "the later term")
        assert await ws.read_message() is None, "closed once another member serves"


async def test_probes_carry_the_token_and_a_wrong_one_finds_no_member() -> None:
    async with members(FakeMember("a", serving=True, term=1)) as (a,):
        async with proxy_of([a.url], token="not-the-token") as proxy:
            await wait_until(lambda: proxy.rounds >= 3, WITHIN, "three probe rounds")
            assert proxy.serving is None
        assert a.probes
        assert set(a.probes) == {"token not-the-token"}

        a.probes.clear()
        async with proxy_of([a.url]) as proxy:
            await wait_until(lambda: proxy.serving == a.url, WITHIN, "a to be forwarded to")
        assert set(a.probes) == {f"token {TOKEN}"}


@pytest.mark.parametrize(
    ("argv", "env_token", "says"),
    [
        ([f"--token={TOKEN}"], None, "--members is required"),
        (["--members=http://gw1:8765,gw2:8765", f"--token={TOKEN}"], None, "'gw2:8765'"),
        (["--members=http://gw1:8765/base", f"--token={TOKEN}"], None, "host and port only"),
        (["--members=http://gw1:8765"], None, "a token is required"),
        (["--members=http://gw1:8765"], "short", "at least 8 characters"),
        (["--members", "http://gw1:8765", "http://gw2:8765", f"--token={TOKEN}"], None, "commas"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(
    argv: list[str],
    env_token: str | None,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if env_token is None:
        monkeypatch.delenv("KERNELFLEET_TOKEN", raising=False)
    else:
        monkeypatch.setenv("KERNELFLEET_TOKEN", env_token)
    app = GatewayProxyApp()
    app.log.propagate = True  # to caplog
    with pytest.raises(SystemExit) as exited:
        app.initialize(argv)
    assert exited.value.code == 1
    assert says in caplog.text


def test_members_may_be_comma_separated_or_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFLEET_TOKEN", TOKEN)
    app = GatewayProxyApp()
    app.parse_command_line(["--members=http://a:1/,https://b:2", "--members=http://c:3"])
    assert app.members == ["http://a:1", "https://b:2", "http://c:3"]


async def test_the_command_listens_forwards_and_stops_on_sigterm(tmp_path: Path) -> None:
    async with members(FakeMember("a", serving=True, term=1)) as (a,):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kernelfleet",
            "gateway-proxy",
            "--port=0",
            f"--members={a.url}",
            f"--state-dir={tmp_path}",
            "--probe-interval=0.05",
            env={**os.environ, "KERNELFLEET_TOKEN": TOKEN},
        )
        try:
            runtime = await wait_until(
                lambda: read_runtime(tmp_path, GatewayRuntime, process.pid), 10, "runtime.json"
            )
            request = HTTPRequest(f"{runtime.url}/who", request_timeout=WITHIN)
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            assert (response.code, response.body) == (200, b"a")
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), WITHIN) == 0
            assert not (tmp_path / "runtime.json").exists()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
