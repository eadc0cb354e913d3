"""The host agent as a real subprocess: heartbeats, real ipykernel replicas, faults, signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from kernelfleet.errors import (
    Conflict,
    HostUnavailable,
    InvalidRequest,
    KernelDead,
    KernelStartFailed,
    NotFound,
)
from kernelfleet.kernels.agent.fingerprint import configured
from kernelfleet.protocol import CONNECTION_KEYS
from kernelfleet.testing import free_port, pid_alive, wait_until

from .conftest import REPO_ROOT, TOKEN, AgentProcess, GatewayRecorder

pytestmark = pytest.mark.timeout(60)

StartAgent = Callable[..., Awaitable[AgentProcess]]


async def connect(connection: dict[str, Any]) -> AsyncKernelClient:
    kc = AsyncKernelClient()
    kc.load_connection_info(connection)
    kc.start_channels()
    await kc.wait_for_ready(timeout=15)
    return kc


async def execute(kc: AsyncKernelClient, code: str, within: float = 15) -> tuple[dict, str]:
    """Run ``code``; return the execute_reply content and everything printed to stdout."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = await kc.execute_interactive(code, timeout=within, output_hook=hook)
    return reply["content"], "".join(out)


async def raw(
    agent: AgentProcess, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, dict[str, Any] | None]:
    """One HTTP call to the agent, without the client: (status, JSON body)."""
    headers = {"Authorization": f"token {token}"} if token else {}
    data = body if isinstance(body, str) or body is None else json.dumps(body)
    try:
        response = await AsyncHTTPClient().fetch(
            agent.address + path, method=method, headers=headers, body=data, request_timeout=30
        )
        code, payload = response.code, response.body
    except HTTPClientError as e:
        if e.response is None:
            raise
        code, payload = e.code, e.response.body
    return code, (json.loads(payload) if payload else None)


def replica_in(put_body: dict[str, Any], replica_id: str) -> dict[str, Any] | None:
    return next((r for r in put_body["replicas"] if r["id"] == replica_id), None)


# ---- registration and heartbeat -----------------------------------------------------------------


async def test_registers_and_heartbeats(host_agent: StartAgent) -> None:
    async with GatewayRecorder() as gateway:
        agent = await host_agent(gateway_url=gateway.url, gpus=2)
        await wait_until(lambda: len(gateway.puts) >= 3, 10, "three heartbeats")
        host_info = await agent.client.host_info()
    first = gateway.puts[0]
    host_id = agent.host_id
    assert host_id.startswith("host-")
    assert first.path == f"/api/fleet/hosts/{host_id}"
    assert first.authorization == f"token {TOKEN}"
    assert len(first.body["instance"]) == 32
    assert all(put.body["instance"] == first.body["instance"] for put in gateway.puts)
    assert first.body == {
        "id": host_id,
        "instance": first.body["instance"],
        "address": agent.address,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-virtual-{host_id}-{i}",
                "name": "kernelfleet virtual GPU",
                "memory_total_mib": 16384,
                "virtual": True,
                "fingerprint": configured(1.0).to_dict(),
            }
            for i in range(2)
        ],
        "gpu_type": "virtual",
        "kind": "on-demand",
        "replicas": [],
        "jobs": [],
        "workers": [],
        "isolation": first.body["isolation"],
        "gpu_settings": [],
    }
    # pytest's folders are 0700: a kernel's own user could not reach this agent's state dir
    assert first.body["isolation"]["kernel_user"] == "agent"
    assert host_info == first.body
    beats = [put.at for put in gateway.puts]
    intervals = [later - earlier for earlier, later in itertools.pairwise(beats)]
    assert all(0.1 < gap < 2.0 for gap in intervals), intervals


async def test_gateway_outage_warns_once_and_keeps_serving(host_agent: StartAgent) -> None:
    port = free_port()
    agent = await host_agent(
        gateway_url=f"http://127.0.0.1:{port}", heartbeat_interval=0.1, args=["--log-level=DEBUG"]
    )
    await wait_until(lambda: agent.log().count("failed again") >= 5, 10, "five failed heartbeats")
    assert agent.log().count("cannot reach the gateway") == 1
    assert (await agent.client.host_info())["id"] == agent.host_id

    async with GatewayRecorder(port) as gateway:
        await gateway.wait_for_put()
        await wait_until(lambda: "answers again" in agent.log(), 5, "the recovery log line")
    await wait_until(
        lambda: agent.log().count("cannot reach the gateway") == 2, 10, "a second outage warning"
    )


# ---- the replica life cycle ---------------------------------------------------------------------


async def test_replica_lifecycle(host_agent: StartAgent, tmp_path: Path) -> None:
    # The agent's own KERNELFLEET_GPUS (its virtual GPU count) must not reach its replicas, where
    # the name means the GPUs bound to the running cell: none before a cell runs.
    agent = await host_agent(gpus=None, env={"KERNELFLEET_GPUS": "2"})
    client = agent.client
    workdir = tmp_path / "work"
    workdir.mkdir()
    model = await client.start_replica(
        "r1", "k1", "python3", env={"KERNEL_WORKING_DIR": str(workdir), "FLEET_TEST_VAR": "hello"}
    )
    agent.kernel_pids.add(model["pid"])
    assert model["id"] == "r1"
    assert model["kernel_id"] == "k1"
    assert model["kernel_name"] == "python3"
    assert model["state"] == "ready"
    assert model["exit_code"] is None
    assert set(model["connection"]) == set(CONNECTION_KEYS)
    assert model["connection"]["ip"] == "127.0.0.1"
    assert pid_alive(model["pid"])
    assert (agent.state_dir / "replicas" / "r1" / "kernel.log").is_file()

    with pytest.raises(Conflict, match="r1"):
        await client.start_replica("r1", "k1", "python3")
    assert [r["id"] for r in await client.list_replicas()] == ["r1"]
    assert (await client.get_replica("r1"))["pid"] == model["pid"]

    kc = await connect(model["connection"])
    try:
        reply, out = await execute(kc, "print(6*7)")
        assert reply["status"] == "ok"
        assert out == "42\n"
        _, out = await execute(
            kc,
            "import os; print(os.getcwd(), os.environ['KERNELFLEET_KERNEL_ID'], "
            "os.environ['KERNELFLEET_REPLICA_ID'], os.environ['FLEET_TEST_VAR'], "
            "'KERNELFLEET_TOKEN' in os.environ, repr(os.environ['KERNELFLEET_GPUS']))",
        )
        assert out.split() == [str(workdir), "k1", "r1", "hello", "False", "''"]

        # interrupt a long cell
        started = asyncio.Event()

        def hook(msg: dict[str, Any]) -> None:
            # The cell's own output, not execute_input: that comes before the code runs.
            if msg["msg_type"] == "stream" and "sleeping" in msg["content"]["text"]:
                started.set()

        code = "import time; print('sleeping', flush=True); time.sleep(30)"
        cell = asyncio.ensure_future(kc.execute_interactive(code, timeout=30, output_hook=hook))
        await asyncio.wait_for(started.wait(), 10)
        t0 = time.monotonic()
        await client.interrupt_replica("r1")
        interrupted = await asyncio.wait_for(cell, 10)
        assert interrupted["content"]["status"] == "error"
        assert interrupted["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - t0 < 5

        reply, _ = await execute(kc, "x = 1")
        assert reply["status"] == "ok"
    finally:
        kc.stop_channels()

    # restart: same id and ports, new process, empty namespace
    restarted = await client.restart_replica("r1")
    agent.kernel_pids.add(restarted["pid"])
    assert restarted["state"] == "ready"
    assert restarted["pid"] != model["pid"]
    assert restarted["connection"] == model["connection"]
    await wait_until(lambda: not pid_alive(model["pid"]), 5, "the old process to exit")
    kc = await connect(restarted["connection"])
    try:
        reply, _ = await execute(kc, "x")
        assert reply["status"] == "error"
        assert reply["ename"] == "NameError"
    finally:
        kc.stop_channels()

    await client.stop_replica("r1")
    await wait_until(lambda: not pid_alive(restarted["pid"]), 10, "the kernel to exit")
    with pytest.raises(NotFound):
        await client.get_replica("r1")
    with pytest.raises(NotFound):
        await client.stop_replica("r1")
    assert await client.list_replicas() == []


async def test_a_host_name_as_kernel_ip_is_resolved_to_its_address(
    host_agent: StartAgent,
) -> None:
    # A Compose service names itself (deploy/compose.yaml): the kernel's connection carries the
    # address, which jupyter_client accepts as local and the gateway connects to.
    agent = await host_agent(args=["--kernel-ip=localhost"])
    model = await agent.client.start_replica("r1", "k1", "python3")
    agent.kernel_pids.add(model["pid"])
    assert model["connection"]["ip"] == "127.0.0.1"
    kc = await connect(model["connection"])
    try:
        _, out = await execute(kc, "print(6*7)")
        assert out == "42\n"
    finally:
        kc.stop_channels()


async def test_dead_replica_is_reported_at_once_and_can_restart(host_agent: StartAgent) -> None:
    # A 5 s heartbeat interval: the 'dead' report must come from the state change, not the timer.
    async with GatewayRecorder() as gateway:
        agent = await host_agent(gateway_url=gateway.url, heartbeat_interval=5.0)
        await gateway.wait_for_put()
        model = await agent.client.start_replica("r1", "k1", "python3")
        agent.kernel_pids.add(model["pid"])
        await gateway.wait_for_put(lambda p: bool(replica_in(p.body, "r1")))

        killed_at = time.monotonic()
        os.kill(model["pid"], signal.SIGKILL)
        put = await gateway.wait_for_put(
            lambda p: (replica_in(p.body, "r1") or {}).get("state") == "dead", within=4
        )
    assert put.at - killed_at < 3
    dead = replica_in(put.body, "r1")
    assert dead is not None
    assert dead["exit_code"] == -signal.SIGKILL
    assert (await agent.client.get_replica("r1"))["state"] == "dead"
    with pytest.raises(KernelDead):
        await agent.client.interrupt_replica("r1")

    restarted = await agent.client.restart_replica("r1")
    agent.kernel_pids.add(restarted["pid"])
    assert restarted["state"] == "ready"
    assert restarted["exit_code"] is None
    assert pid_alive(restarted["pid"])


async def test_failed_restart_leaves_the_replica_dead_and_restartable(
    host_agent: StartAgent, fault_kernelspecs: dict[str, str], tmp_path: Path
) -> None:
    agent = await host_agent(env=fault_kernelspecs)
    switch = tmp_path / "fail-now"
    model = await agent.client.start_replica("r1", "k1", "fault", {"FAULT_SWITCH": str(switch)})
    agent.kernel_pids.add(model["pid"])
    assert model["state"] == "ready"

    switch.touch()
    with pytest.raises(KernelStartFailed, match="boom"):
        await agent.client.restart_replica("r1")
    dead = await agent.client.get_replica("r1")
    assert dead["state"] == "dead"
    assert dead["exit_code"] == 3
    assert not pid_alive(model["pid"])

    switch.unlink()
    restarted = await agent.client.restart_replica("r1")
    agent.kernel_pids.add(restarted["pid"])
    assert restarted["state"] == "ready"
    assert restarted["connection"] == model["connection"]
    kc = await connect(restarted["connection"])
    try:
        _, out = await execute(kc, "print('back')")
        assert out == "back\n"
    finally:
        kc.stop_channels()


# ---- failures -----------------------------------------------------------------------------------


async def test_start_failures(host_agent: StartAgent, fault_kernelspecs: dict[str, str]) -> None:
    agent = await host_agent(env=fault_kernelspecs)
    client = agent.client

    # a kernel that writes "boom" and exits 3: a prompt 500, far inside the 30 s launch timeout
    t0 = time.monotonic()
    status, body = await raw(
        agent,
        "POST",
        "/api/replicas",
        {"replica_id": "f1", "kernel_id": "k", "kernel_name": "fault", "launch_timeout": 30},
    )
    assert time.monotonic() - t0 < 5
    assert status == 500
    assert body is not None
    assert body["reason"] == "kernel-start-failed"
    assert "boom" in body["message"]
    assert "code 3" in body["message"]
    with pytest.raises(KernelStartFailed, match="boom"):
        await client.start_replica("f2", "k", "fault")

    # a kernel that never answers: killed at its launch timeout
    pid_file = agent.state_dir / "stall.pid"
    t0 = time.monotonic()
    with pytest.raises(KernelStartFailed, match="within 1 s"):
        await client.start_replica(
            "f3", "k", "fault", {"FAULT_MODE": "stall", "FAULT_PID_FILE": str(pid_file)}, 1.0
        )
    assert time.monotonic() - t0 < 5
    stalled = int(pid_file.read_text())
    agent.kernel_pids.add(stalled)
    assert not pid_alive(stalled)
    assert await client.list_replicas() == []

    # a kernelspec whose program does not exist
    with pytest.raises(KernelStartFailed, match="could not be launched"):
        await client.start_replica("f4", "k", "missing")
    assert await client.list_replicas() == []

    # unknown kernelspec: 404 naming the valid ones
    status, body = await raw(
        agent, "POST", "/api/replicas", {"replica_id": "x", "kernel_id": "k", "kernel_name": "nope"}
    )
    assert status == 404
    assert body is not None
    assert body["reason"] == "not-found"
    assert "python3" in body["message"]
    assert "fault" in body["message"]
    with pytest.raises(NotFound, match="python3"):
        await client.start_replica("x", "k", "nope")


BAD_BODIES: list[tuple[Any, str]] = [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({"kernel_id": "k", "kernel_name": "python3"}, "replica_id"),
    ({"replica_id": "../etc", "kernel_id": "k", "kernel_name": "python3"}, "replica_id"),
    ({"replica_id": "r", "kernel_name": "python3"}, "kernel_id"),
    ({"replica_id": "r", "kernel_id": "k", "kernel_name": "python3", "env": {"A": 1}}, "env"),
    (
        {"replica_id": "r", "kernel_id": "k", "kernel_name": "python3", "launch_timeout": -1},
        "launch_timeout",
    ),
    (
        {
            "replica_id": "r",
            "kernel_id": "k",
            "kernel_name": "python3",
            "env": {"KERNEL_LAUNCH_TIMEOUT": "soon"},
        },
        "KERNEL_LAUNCH_TIMEOUT",
    ),
]


async def test_bad_requests_are_400(host_agent: StartAgent) -> None:
    agent = await host_agent(gpus=None)
    for body, complaint in BAD_BODIES:
        data = body if isinstance(body, str) else json.dumps(body)
        status, payload = await raw(agent, "POST", "/api/replicas", data)
        assert status == 400, (body, status, payload)
        assert payload is not None
        assert payload["reason"] == "invalid-request", payload
        assert complaint in payload["message"], (complaint, payload)
    status, payload = await raw(agent, "POST", "/api/replicas/nope/restart", "[]")
    assert status == 400
    assert payload is not None
    assert payload["reason"] == "invalid-request"
    assert await agent.client.list_replicas() == []


async def test_tokens_and_unknown_paths(host_agent: StartAgent) -> None:
    agent = await host_agent()
    status, body = await raw(agent, "GET", "/api/host", token=None)
    assert status == 401
    assert body is not None
    assert body["reason"] == "unauthorized"
    status, body = await raw(agent, "GET", "/api/replicas", token="wrong")
    assert status == 403
    assert body is not None
    assert body["reason"] == "forbidden"
    status, body = await raw(agent, "GET", "/api/nothing")
    assert status == 404
    assert body is not None
    assert body["reason"] == "not-found"
    with pytest.raises(NotFound):
        await agent.client.get_replica("missing")
    with pytest.raises(NotFound):
        await agent.client.restart_replica("missing")
    with pytest.raises(NotFound):
        await agent.client.interrupt_replica("missing")

    from kernelfleet.kernels.agent.client import HostAgentClient

    wrong = HostAgentClient(agent.address, "wrong")
    try:
        with pytest.raises(HostUnavailable, match=agent.address):
            await wrong.host_info()
    finally:
        wrong.close()
    with pytest.raises(InvalidRequest):
        await agent.client.start_replica("bad id!", "k", "python3")


# ---- signals ------------------------------------------------------------------------------------


async def test_sigterm_stops_every_kernel_and_exits_0(host_agent: StartAgent) -> None:
    agent = await host_agent()
    models = await asyncio.gather(
        agent.client.start_replica("a", "k1", "python3"),
        agent.client.start_replica("b", "k2", "python3"),
    )
    pids = [m["pid"] for m in models]
    agent.kernel_pids.update(pids)
    assert all(pid_alive(pid) for pid in pids)
    t0 = time.monotonic()
    agent.signal(signal.SIGTERM)
    assert await agent.wait_exit(10) == 0
    assert time.monotonic() - t0 < 8
    assert not any(pid_alive(pid) for pid in pids)
    assert "stopping 2 replica(s)" in agent.log()


async def test_kernels_exit_when_the_agent_is_killed(host_agent: StartAgent) -> None:
    agent = await host_agent()
    model = await agent.client.start_replica("r1", "k1", "python3")
    agent.kernel_pids.add(model["pid"])
    agent.signal(signal.SIGKILL)
    await agent.wait_exit(5)
    await wait_until(lambda: not pid_alive(model["pid"]), 10, "the orphaned kernel to exit")


# ---- start-up errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        ([], "no token"),
        (["--token=t", "--heartbeat-interval=-1"], "heartbeat_interval must be a positive"),
        (["--token=t", "--gateway=ftp://x"], "gateway_url must be an http(s) URL"),
        (["--token=t", "--gpus=-2"], "gpus must be 0 or more"),
        (["--token=t", "--gpus=2", "--gpu-inventory=nvml"], "cannot be combined"),
        (
            ["--token=t", "--kernel-ip=no-such-host.invalid"],
            "kernel_ip: 'no-such-host.invalid' is neither an IP address nor a host name",
        ),
    ],
)
def test_bad_configuration_fails_at_start(tmp_path: Path, args: list[str], complaint: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "host", "--state-dir", str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert complaint in result.stderr
