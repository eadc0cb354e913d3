"""FleetClient against a small real HTTP server of the test's own, and against no server at all.

The server runs tornado on a thread of its own (the client blocks), answers each route with what
the test set in ``answers`` and records every request it got.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

import kernelfleet
from kernelfleet.client import (
    FleetApiError,
    FleetClient,
    GatewayUnreachable,
    NotAFleetKernel,
)
from kernelfleet.errors import FleetError
from kernelfleet.testing import free_port

TOKEN = "kfk1.k-1.test"


@dataclass
class Seen:
    method: str
    uri: str
    authorization: str
    body: Any


@dataclass
class Answer:
    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    delay: float = 0.0


@dataclass
class FakeGateway:
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)
    """path -> what to answer; any other path answers ``{}``."""


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    class Everything(web.RequestHandler):
        async def handle(self) -> None:
            request = self.request
            body = json.loads(request.body) if request.body else None
            fake.seen.append(
                Seen(request.method, request.uri, request.headers.get("Authorization", ""), body)
            )
            answer = fake.answers.get(request.path, Answer())
            if answer.delay:
                await asyncio.sleep(answer.delay)
            self.set_status(answer.status)
            self.set_header("Content-Type", answer.content_type)
            self.finish(answer.body)

        get = post = put = handle

    def serve() -> None:
        asyncio.set_event_loop(loop)
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(web.Application([(r".*", Everything)]))
        server.add_sockets(sockets)
        fake.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        loop.call_soon(ready.set)
        loop.run_forever()
        server.stop()
        loop.run_until_complete(server.close_all_connections())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield fake
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def json_answer(value: Any, status: int = 200) -> Answer:
    return Answer(status=status, body=json.dumps(value).encode())


def test_each_call_sends_the_token_to_its_route_and_returns_the_json(gateway):
    client = FleetClient(gateway.url + "/", TOKEN, kernel_id="k-1")
    gateway.answers["/api/fleet/kernels/k-1"] = json_answer({"id": "k-1", "replicas": []})
    gateway.answers["/api/fleet/hosts"] = json_answer([{"id": "host-1"}])
    assert client.kernel() == {"id": "k-1", "replicas": []}
    assert client.hosts() == [{"id": "host-1"}]
    assert client.fleet() == {}
    client.migrate("host-4")
    client.migrate()
    client.set_gpus(2)
    client.events(5)
    assert [(s.method, s.uri, s.body) for s in gateway.seen] == [
        ("GET", "/api/fleet/kernels/k-1", None),
        ("GET", "/api/fleet/hosts", None),
        ("GET", "/api/fleet", None),
        ("POST", "/api/fleet/kernels/k-1/migrate", {"host": "host-4"}),
        ("POST", "/api/fleet/kernels/k-1/migrate", {}),
        ("PUT", "/api/fleet/kernels/k-1/gpus", {"gpus": 2}),
        ("GET", "/api/fleet/events?n=5&kernel=k-1", None),
    ]
    assert {s.authorization for s in gateway.seen} == {f"token {TOKEN}"}


def test_without_a_kernel_id_events_are_the_fleets_and_kernel_calls_refuse(gateway):
    client = FleetClient(gateway.url, TOKEN)
    client.events()
    assert gateway.seen[-1].uri == "/api/fleet/events?n=20"
    for call in (client.kernel, client.migrate, lambda: client.set_gpus(1)):
        with pytest.raises(ValueError, match="no kernel_id"):
            call()
    assert len(gateway.seen) == 1


def test_an_error_answer_raises_fleet_api_error_with_the_gateways_reason(gateway):
    client = FleetClient(gateway.url, TOKEN, kernel_id="k-1")
    gateway.answers["/api/fleet/kernels/k-1/migrate"] = json_answer(
        {"reason": "not-found", "message": "no host 'host-99'"}, status=404
    )
    with pytest.raises(FleetApiError) as raised:
        client.migrate("host-99")
    error = raised.value
    assert (error.status, error.reason) == (404, "not-found")
    assert error.api_message == "no host 'host-99'"
    assert "no host 'host-99'" in str(error)
    assert isinstance(error, FleetError)
    assert error._render_traceback_() == [f"FleetApiError: {error.message}"]


def test_an_error_answer_that_is_not_json_still_says_what_came(gateway):
    client = FleetClient(gateway.url, TOKEN, kernel_id="k-1")
    gateway.answers["/api/fleet"] = Answer(502, b"<html>Bad Gateway</html>", "text/html")
    with pytest.raises(FleetApiError) as raised:
        client.fleet()
    assert (raised.value.status, raised.value.reason) == (502, "http-error")
    assert "Bad Gateway" in raised.value.api_message
    gateway.answers["/api/fleet/hosts"] = Answer(200, b"not json", "text/plain")
    with pytest.raises(FleetApiError, match="not JSON"):
        client.hosts()


def test_no_server_raises_gateway_unreachable_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    client = FleetClient(url, TOKEN, kernel_id="k-1", timeout=5)
    started = time.monotonic()
    with pytest.raises(GatewayUnreachable) as raised:
        client.kernel()
    assert time.monotonic() - started < 5, "a refused connection fails at once"
    assert raised.value.url == url
    assert f"the kernelfleet gateway at {url} is unreachable" in str(raised.value)
    assert raised.value.reason == "gateway-unreachable"
    assert raised.value._render_traceback_() == [f"GatewayUnreachable: {raised.value.message}"]


def test_a_gateway_slower_than_the_timeout_is_unreachable(gateway):
    client = FleetClient(gateway.url, TOKEN, timeout=0.3)
    gateway.answers["/api/fleet"] = Answer(delay=2.0)
    started = time.monotonic()
    with pytest.raises(GatewayUnreachable, match=r"no answer within 0\.3 s"):
        client.fleet()
    assert time.monotonic() - started < 1.5


def test_a_proxy_in_the_environment_is_not_used(gateway, monkeypatch):
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("http_proxy", dead_proxy)
    monkeypatch.setenv("HTTP_PROXY", dead_proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert FleetClient(gateway.url, TOKEN).fleet() == {}


def test_the_readme_example_runs(gateway, monkeypatch, capsys):
    readme = (Path(kernelfleet.__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## In the notebook: %magics", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.setenv("KERNELFLEET_GATEWAY_URL", gateway.url)
    monkeypatch.setenv("KERNELFLEET_KERNEL_TOKEN", TOKEN)
    monkeypatch.setenv("KERNELFLEET_KERNEL_ID", "k-1")
    replicas = [{"id": "r-1", "host": "host-1"}, {"id": "r-2", "host": "host-3"}]
    gateway.answers["/api/fleet/kernels/k-1"] = json_answer({"id": "k-1", "replicas": replicas})
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out == "['host-1', 'host-3']\n"
    assert gateway.seen[-1].authorization == f"token {TOKEN}"


def test_from_environment_reads_the_replicas_variables():
    env = {
        "KERNELFLEET_GATEWAY_URL": "http://10.0.0.5:8765/",
        "KERNELFLEET_KERNEL_TOKEN": TOKEN,
        "KERNELFLEET_KERNEL_ID": "k-1",
    }
    client = FleetClient.from_environment(env, timeout=3)
    assert (client.url, client.kernel_id, client.timeout) == ("http://10.0.0.5:8765", "k-1", 3)
    assert TOKEN not in repr(client)


@pytest.mark.parametrize(
    "missing", ["KERNELFLEET_GATEWAY_URL", "KERNELFLEET_KERNEL_TOKEN", "KERNELFLEET_KERNEL_ID"]
)
def test_outside_a_kernelfleet_kernel_from_environment_says_so(missing):
    env = {
        "KERNELFLEET_GATEWAY_URL": "http://10.0.0.5:8765",
        "KERNELFLEET_KERNEL_TOKEN": TOKEN,
        "KERNELFLEET_KERNEL_ID": "k-1",
    }
    del env[missing]
    with pytest.raises(NotAFleetKernel, match=f"not run by kernelfleet .*{missing}"):
        FleetClient.from_environment(env)
