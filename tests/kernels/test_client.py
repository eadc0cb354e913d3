"""HostAgentClient's error mapping, against a scripted agent double (tornado, in-process)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from kernelfleet.errors import (
    Conflict,
    HostUnavailable,
    KernelDead,
    KernelStartFailed,
    NotFound,
)
from kernelfleet.kernels.agent.client import HostAgentClient
from kernelfleet.testing import free_port

# path -> (status, raw body) the double answers
SCRIPT: dict[str, tuple[int, str]] = {
    "/api/replicas/gone": (404, json.dumps({"reason": "not-found", "message": "no replica gone"})),
    "/api/replicas/dup": (409, json.dumps({"reason": "conflict", "message": "dup in use"})),
    "/api/replicas/dead/interrupt": (409, json.dumps({"reason": "kernel-dead", "message": "rip"})),
    "/api/replicas/fail/restart": (
        500,
        json.dumps({"reason": "kernel-start-failed", "message": "boom\ntail"}),
    ),
    "/api/replicas/odd": (418, json.dumps({"reason": "teapot", "message": "short and stout"})),
    "/api/replicas/html": (502, "<html>bad gateway</html>"),
    "/api/replicas/crash": (
        500,
        json.dumps({"reason": "internal-error", "message": "see the log"}),
    ),
}


class Double(web.RequestHandler):
    async def prepare(self) -> None:
        if self.request.path == "/api/replicas/slow":
            await asyncio.sleep(2)
        status, body = SCRIPT.get(self.request.path, (200, json.dumps({"path": self.request.path})))
        self.set_status(status)
        self.finish(body)


@contextlib.asynccontextmanager
async def agent_double() -> AsyncIterator[HostAgentClient]:
    """Serve the scripted double on the running loop; yield a client for it."""
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(web.Application([(r".*", Double)]))
    server.add_sockets(sockets)
    client = HostAgentClient(f"http://127.0.0.1:{sockets[0].getsockname()[1]}", "t", 0.5)
    try:
        yield client
    finally:
        client.close()
        server.stop()
        await server.close_all_connections()


async def test_domain_errors_keep_their_class_and_message() -> None:
    async with agent_double() as client:
        await check_domain_errors(client)


async def check_domain_errors(client: HostAgentClient) -> None:
    with pytest.raises(NotFound, match="no replica gone"):
        await client.get_replica("gone")
    with pytest.raises(Conflict, match="dup in use"):
        await client.stop_replica("dup")
    with pytest.raises(KernelDead, match="rip"):
        await client.interrupt_replica("dead")
    with pytest.raises(KernelStartFailed) as info:
        await client.restart_replica("fail")
    assert info.value.message == "boom\ntail"
    assert info.value.reason == "kernel-start-failed"


@pytest.mark.parametrize("replica_id", ["odd", "html", "crash", "slow"])
async def test_other_failures_are_host_unavailable(replica_id: str) -> None:
    async with agent_double() as client:
        with pytest.raises(HostUnavailable, match=client.address):
            await client.get_replica(replica_id)


async def test_unreachable_agent_is_host_unavailable() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    client = HostAgentClient(address, "t")
    try:
        with pytest.raises(HostUnavailable, match=address):
            await client.host_info()
    finally:
        client.close()


async def test_ids_are_quoted_in_paths() -> None:
    async with agent_double() as client:
        assert await client.get_replica("a b") == {"path": "/api/replicas/a%20b"}


def test_start_timeouts_outlast_the_launch_timeout() -> None:
    client = HostAgentClient("http://h:1", "t", request_timeout=5, launch_timeout=40)
    assert client._launch_budget(None, {}) > 40
    assert client._launch_budget(100, {}) > 100
    assert client._launch_budget(None, {"KERNEL_LAUNCH_TIMEOUT": "90"}) > 90
