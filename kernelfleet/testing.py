"""kernelfleet's pytest plugin: real gateway and host-agent processes, and a kernel client.

Enable with ``pytest_plugins = ["kernelfleet.testing"]``. Fixtures are factories:
``fleet_factory(hosts=3, gpus=2, env=...)`` starts a gateway and host agents as subprocesses on
ephemeral ports; ``fleet`` is one shared 3-host fleet for tests that do not break it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.session import Session
from tornado.websocket import WebSocketClientConnection

TOKEN = "test-token-0123456789abcdef"
_LISTENING = re.compile(r"gateway listening on (http://\S+)")


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Fleet:
    """A gateway and its host agents running as subprocesses."""

    state_dir: Path
    token: str
    env: dict[str, str]
    gateway: subprocess.Popen | None = None
    hosts: dict[str, subprocess.Popen] = field(default_factory=dict)
    url: str = ""
    gateway_args: tuple[str, ...] = ()

    def spawn(self, label: str, *args: str) -> subprocess.Popen:
        log = (self.state_dir / f"{label}.log").open(
            "wb"
        )  # a stale log would mislead start_gateway
        return subprocess.Popen(
            [sys.executable, "-m", "kernelfleet", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                **self.env,
                "KERNELFLEET_TOKEN": self.token,
                "PYTHONUNBUFFERED": "1",
            },
            start_new_session=True,
        )

    def start_gateway(self, *args: str, port: int = 0) -> None:
        self.gateway = self.spawn(
            "gateway",
            "gateway",
            "--port",
            str(port),
            "--state-dir",
            str(self.state_dir / "gateway"),
            *args,
        )
        match = wait_for(lambda: self._poll_log("gateway", _LISTENING), 30, "the gateway to listen")
        self.url = match.group(1)

    def start_host(self, host_id: str, gpus: int = 2, *args: str) -> subprocess.Popen:
        process = self.spawn(
            host_id, "host", "--gateway", self.url, "--host-id", host_id, "--gpus", str(gpus),
            "--state-dir", str(self.state_dir / host_id), *args,
        )  # fmt: skip
        self.hosts[host_id] = process
        wait_for(lambda: self.host_state(host_id) == "alive", 30, f"host {host_id} to register")
        return process

    def _poll_log(self, label: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
        process = self.gateway if label == "gateway" else self.hosts.get(label)
        if process is not None and process.poll() is not None:
            pytest.fail(f"{label} exited with {process.returncode}:\n{self.log(label)[-3000:]}")
        return pattern.search(self.log(label))

    def log(self, label: str = "gateway") -> str:
        path = self.state_dir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- the gateway's HTTP API ------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        """Call the gateway; returns (status, parsed JSON body or None). Never raises on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        token = self.token if token is None else token
        if token:
            headers["Authorization"] = f"token {token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        return status, (json.loads(raw) if raw else None)

    def request_text(self, method: str, path: str) -> str:
        """Call the gateway with the token; the body as text (``/metrics``), 200 expected."""
        headers = {"Authorization": f"token {self.token}"}
        request = urllib.request.Request(self.url + path, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(response.read().decode())

    def api(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, payload = self.request(method, path, body)
        assert status == expect, f"{method} {path}: {status} {payload}"
        return payload

    def host_state(self, host_id: str) -> str | None:
        status, payload = self.request("GET", "/api/fleet/hosts")
        states = {h["id"]: h["state"] for h in payload} if status == 200 else {}
        return states.get(host_id)

    def start_kernel(self, name: str = "python3", env: dict[str, str] | None = None) -> str:
        return self.api("POST", "/api/kernels", {"name": name, "env": env or {}}, expect=201)["id"]

    def ws_url(self, kernel_id: str, session_id: str = "test") -> str:
        return (
            self.url.replace("http", "ws", 1)
            + f"/api/kernels/{kernel_id}/channels?session_id={session_id}"
        )

    async def connect(
        self, kernel_id: str, token: str | None = None, subprotocol: str | None = None
    ) -> KernelWebsocket:
        """A websocket kernel client straight to the gateway (no jupyter_server in between)."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        headers = {"Authorization": f"token {self.token if token is None else token}"}
        ws = await websocket_connect(
            HTTPRequest(self.ws_url(kernel_id), headers=headers),
            subprotocols=[subprotocol] if subprotocol else None,
        )
        return KernelWebsocket(ws)

    # ---- processes -------------------------------------------------------------------------

    def restart_gateway(self, signum: int = signal.SIGKILL, *args: str) -> None:
        """Stop the gateway with `signum`, then start a new one on the same port and state."""
        assert self.gateway is not None
        os.killpg(self.gateway.pid, signum)
        self.gateway.wait(20)
        port = int(self.url.rsplit(":", 1)[1])
        self.start_gateway(*self.gateway_args, *args, port=port)

    def signal_host(self, host_id: str, signum: int = signal.SIGKILL) -> None:
        """Signal a host agent and every process under it, its kernels included, as when
        the machine is lost (kernels run in sessions of their own)."""
        agent = self.hosts[host_id].pid
        below = descendants(agent)
        os.killpg(agent, signum)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        self.hosts[host_id].wait(10)

    def stop(self) -> None:
        """SIGTERM the gateway and the hosts, SIGKILL what lingers, including host agents the
        gateway's autoscaler started."""
        started_by_gateway = descendants(self.gateway.pid) if self.gateway is not None else []
        for process in [self.gateway, *self.hosts.values()]:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [self.gateway, *self.hosts.values()]:
            if process is None:
                continue
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for pid in started_by_gateway:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """The pids of every live process below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def start_fleet(
    state_dir: Path,
    hosts: int = 3,
    gpus: int = 2,
    env: dict[str, str] | None = None,
    token: str = TOKEN,
    replicas: int = 1,
) -> Fleet:
    """A gateway and `hosts` agents; kernels get `replicas` replicas (1 unless asked)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(state_dir=state_dir, token=token, env=env or {})
    try:
        fleet.gateway_args = ("--replicas", str(replicas))
        fleet.start_gateway(*fleet.gateway_args)
        for i in range(1, hosts + 1):
            fleet.start_host(f"host-{i}", gpus)
    except BaseException:
        fleet.stop()
        raise
    return fleet


@pytest.fixture(scope="session")
def fleet_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """``fleet_factory(hosts=3, gpus=2, env=None)`` starts a fleet, stopped at the session's end."""
    fleets: list[Fleet] = []

    def factory(**kwargs: Any) -> Fleet:
        fleet = start_fleet(tmp_path_factory.mktemp("fleet"), **kwargs)
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        fleet.stop()


@pytest.fixture(scope="session")
def fleet(fleet_factory: Callable[..., Fleet]) -> Fleet:
    """A shared fleet of 3 hosts x 2 virtual GPUs. Tests must leave it healthy."""
    return fleet_factory(hosts=3, gpus=2)


# ---- a kernel client over a websocket ---------------------------------------------------------


@dataclass
class Reply:
    """What one request produced: the reply's content and the IOPub messages it caused."""

    reply: dict[str, Any]
    iopub: list[dict[str, Any]]

    @property
    def stdout(self) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.iopub
            if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.iopub if m["header"]["msg_type"] == msg_type]


V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"


class KernelWebsocket:
    """A kernel client over a websocket: sends requests, collects replies and IOPub by parent.

    Speaks the framing the server selected (``ws.selected_subprotocol``): v1 or legacy. It
    encodes and decodes with jupyter_server's own functions, independent of the gateway's code.
    """

    def __init__(self, ws: WebSocketClientConnection) -> None:
        self.ws = ws
        self.protocol = ws.selected_subprotocol
        self.session = Session(username="test")
        self.unclaimed: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []

    def send(
        self,
        msg_type: str,
        content: dict[str, Any],
        channel: str = "shell",
        buffers: list[bytes] | None = None,
        metadata: dict[str, Any] | None = None,
        msg_id: str | None = None,
    ) -> str:
        """Send a request; `msg_id` reuses an id (to send a duplicate). Returns the msg_id."""
        from jupyter_server.services.kernels.connection.base import (
            serialize_binary_message,
            serialize_msg_to_ws_v1,
        )

        header = self.session.msg_header(msg_type)
        if msg_id is not None:
            header["msg_id"] = msg_id
        msg = self.session.msg(msg_type, content=content, header=header, metadata=metadata or {})
        if self.protocol == V1_PROTOCOL:
            parts = [self.session.pack(msg[key]) for key in ("header", "parent_header", "metadata")]
            parts.append(self.session.pack(content))
            self.ws.write_message(serialize_msg_to_ws_v1([*parts, *(buffers or [])], channel), True)
            return msg["header"]["msg_id"]
        msg["channel"] = channel
        if buffers:
            msg["buffers"] = buffers
            self.ws.write_message(serialize_binary_message(msg), binary=True)
        else:
            msg["buffers"] = []
            self.ws.write_message(json.dumps(msg, default=str))
        return msg["header"]["msg_id"]

    async def receive(self, timeout: float = 30) -> dict[str, Any]:
        from jupyter_server.services.kernels.connection.base import (
            deserialize_binary_message,
            deserialize_msg_from_ws_v1,
        )

        frame = await asyncio.wait_for(self.ws.read_message(), timeout)
        if frame is None:
            raise ConnectionError("the websocket closed")
        if self.protocol == V1_PROTOCOL:
            assert isinstance(frame, bytes), "v1 frames are binary"
            channel, pieces = deserialize_msg_from_ws_v1(frame)
            keys = ("header", "parent_header", "metadata", "content")
            msg = {key: json.loads(piece) for key, piece in zip(keys, pieces, strict=False)}
            return {**msg, "channel": channel, "buffers": pieces[4:]}
        if isinstance(frame, bytes):
            return deserialize_binary_message(frame)
        return json.loads(frame)

    async def request(
        self,
        msg_type: str,
        content: dict[str, Any],
        timeout: float = 30,
        channel: str = "shell",
        expect_reply: bool = True,
        **kwargs: Any,
    ) -> Reply:
        """Send a message; wait for its reply (unless it has none, as ``comm_msg``) and for the
        kernel to go idle after it."""
        msg_id = self.send(msg_type, content, channel=channel, **kwargs)
        return await self.collect(msg_id, timeout, channel, expect_reply)

    async def collect(
        self, msg_id: str, timeout: float = 30, channel: str = "shell", expect_reply: bool = True
    ) -> Reply:
        """Gather what request `msg_id` caused until its reply and the idle status arrived."""
        reply: dict[str, Any] | None = None if expect_reply else {}
        iopub: list[dict[str, Any]] = []
        idle = False
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            msg = await self._next_for(msg_id, deadline)
            if msg["channel"] == "iopub":
                iopub.append(msg)
                if (
                    msg["header"]["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"
                ):
                    idle = True
            elif msg["channel"] == channel:
                reply = msg["content"]
        assert reply is not None
        return Reply(reply, iopub)

    async def wait_for_output(self, msg_id: str, text: str, timeout: float = 30) -> None:
        """Wait until request `msg_id` printed `text`; its other messages stay to be collected."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        try:
            while True:
                msg = await self._next_for(msg_id, deadline)
                seen.append(msg)
                if msg["header"]["msg_type"] == "stream" and text in msg["content"]["text"]:
                    return
        finally:
            self._pending = seen + self._pending

    async def _next_for(self, msg_id: str, deadline: float) -> dict[str, Any]:
        """The next message whose parent is `msg_id`; others are kept in ``unclaimed``."""
        for index, msg in enumerate(self._pending):
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return self._pending.pop(index)
        while True:
            msg = await self.receive(max(0.01, deadline - time.monotonic()))
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg
            self.unclaimed.append(msg)

    async def execute(self, code: str, timeout: float = 30, **kwargs: Any) -> Reply:
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False}
        return await self.request("execute_request", content, timeout=timeout, **kwargs)

    def close(self) -> None:
        self.ws.close()
