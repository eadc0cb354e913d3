"""A gateway killed with SIGKILL and started again never drops a kernel (issue 12, item 2).

jupyter_server's gateway kernel manager forgets every kernel missing from ``GET /api/kernels``
("no longer active - probably culled"), so the restarted gateway must list its kernels from its
first answer, while it re-links them, and a websocket opened meanwhile must wait for the link.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from tornado.httpclient import HTTPClientError

from kernelfleet.runtime_file import GatewayRuntime, read_runtime
from kernelfleet.testing import Fleet, KernelWebsocket, wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def kill_and_spawn_gateway(fleet: Fleet, *args: str, lose_host: str | None = None) -> None:
    """SIGKILL the gateway (then the host `lose_host`, so that only the new gateway can find it
    gone) and start a new one on its port and state dir; returns as soon as it listens (its
    runtime file names it), without asking it anything."""
    assert fleet.gateway is not None
    os.killpg(fleet.gateway.pid, signal.SIGKILL)
    fleet.gateway.wait(20)
    if lose_host is not None:
        fleet.signal_host(lose_host, signal.SIGKILL)
    port = int(fleet.url.rsplit(":", 1)[1])
    state_dir = fleet.state_dir / "gateway"
    gateway = fleet.gateway = fleet.spawn(
        "gateway", "gateway", "--ip", fleet.ip, "--port", str(port),
        "--state-dir", str(state_dir), *fleet.gateway_args, *args,
    )  # fmt: skip

    def listening() -> bool:
        fleet.check_running("gateway")
        return read_runtime(state_dir, GatewayRuntime, gateway.pid) is not None

    wait_for(listening, 30, "the new gateway to listen")


async def test_killed_gateway_lists_its_kernel_from_its_first_answer(private_fleet):
    fleet = private_fleet(hosts=3, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("x = 41")).reply["status"] == "ok"
    client.close()

    kill_and_spawn_gateway(fleet)

    first = fleet.api("GET", "/api/kernels")
    assert [k["id"] for k in first] == [kernel_id], "the very first answer lists the kernel"
    assert first[0]["execution_state"] in ("starting", "idle")
    assert fleet.api("GET", f"/api/kernels/{kernel_id}")["id"] == kernel_id
    client = await fleet.connect(kernel_id)  # waits for the re-link
    assert (await client.execute("print(x + 1)")).stdout == "42\n"
    client.close()
    assert fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "idle"
    assert len(fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]) == 3
    assert "adopted from the previous gateway" in fleet.log()


async def test_a_kernel_whose_host_never_comes_back_is_reported_dead_saying_why(private_fleet):
    fleet = private_fleet(hosts=1, gpus=0, replicas=1)
    kernel_id = fleet.start_kernel()
    kill_and_spawn_gateway(fleet, "--GatewayApp.recovery_grace=3", lose_host="host-1")

    first = fleet.api("GET", "/api/kernels")
    assert [(k["id"], k["execution_state"]) for k in first] == [(kernel_id, "starting")]
    wait_for(
        lambda: fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "dead",
        20,
        "the kernel to be reported dead once the grace is over",
    )
    assert "its host host-1 did not come back within 3 s" in fleet.log()


async def test_a_replicated_kernel_missing_one_host_after_a_restart_lives_on(private_fleet):
    fleet = private_fleet(hosts=3, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("x = 41")).reply["status"] == "ok"
    client.close()
    lost = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"][2]
    kill_and_spawn_gateway(fleet, "--GatewayApp.recovery_grace=3", lose_host=lost["host"])

    assert [k["id"] for k in fleet.api("GET", "/api/kernels")] == [kernel_id]
    client = await fleet.connect(kernel_id)
    assert (await client.execute("print(x + 1)")).stdout == "42\n"
    client.close()
    assert fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "idle"
    states = {
        r["id"]: r["state"] for r in fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    }
    assert states[lost["id"]] == "dead"
    assert f"its host {lost['host']} did not come back within 3 s" in fleet.log()


# ---- through a real jupyter_server in gateway mode -----------------------------------------


@pytest.fixture
def restart_fleet(private_fleet):
    return private_fleet(hosts=3, gpus=0, replicas=3)


@pytest.fixture
def jp_server_config(restart_fleet):
    """jupyter_server in gateway mode, pointed at this module's own fleet (restarted here)."""
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {
            "url": restart_fleet.url,
            "auth_token": restart_fleet.token,
            "request_timeout": 60.0,
        },
    }


async def test_jupyter_server_never_drops_the_kernel_across_a_gateway_restart(
    restart_fleet, jp_fetch, jp_ws_fetch
):
    fleet = restart_fleet
    kernel = json.loads((await jp_fetch("api", "kernels", method="POST", body="{}")).body)
    ws = await jp_ws_fetch("api", "kernels", kernel["id"], "channels", params={"session_id": "s"})
    client = KernelWebsocket(ws)
    assert (await client.execute("x = 41")).reply["status"] == "ok"

    listed: list[list[str]] = []
    polling = True

    async def poll() -> None:
        while polling:
            try:
                answer = await jp_fetch("api", "kernels")
            except HTTPClientError:
                pass  # the gateway is down: jupyter_server says so, and keeps its kernels
            else:
                listed.append([k["id"] for k in json.loads(answer.body)])
            await asyncio.sleep(0.1)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(0.5)
    before = len(listed)
    await asyncio.to_thread(kill_and_spawn_gateway, fleet)
    restarted = len(listed)
    deadline = time.monotonic() + 60
    while (fleet.request("GET", f"/api/kernels/{kernel['id']}")[1] or {}).get(
        "execution_state"
    ) != "idle":
        assert time.monotonic() < deadline, "the kernel was not re-linked"
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    polling = False
    await poller

    assert before > 0, "polled before the restart"
    assert len(listed) > restarted, "polled after the restart, while it re-linked"
    dropped = [ids for ids in listed if kernel["id"] not in ids]
    assert not dropped, f"jupyter_server was told the kernel is gone: {dropped}"
    model = json.loads((await jp_fetch("api", "kernels", kernel["id"])).body)
    assert model["id"] == kernel["id"]

    # the websocket opened before the restart: jupyter_server reconnects it to the new gateway
    async def sees_x() -> bool:
        try:
            return (await client.execute("print(x)", timeout=10)).stdout == "41\n"
        except TimeoutError:
            return False

    for _ in range(10):
        if await sees_x():
            break
    else:
        pytest.fail("the reconnected websocket never ran a cell on the surviving kernel")
    client.close()
    await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
    GatewayClient.clear_instance()


# ---- a state file that cannot be read ------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"version": 1, "kernels": [{"id": "k1", "name": "py', id="truncated"),
        pytest.param(b"\x00\x13 not json at all \xff", id="corrupt"),
        pytest.param(b'{"version": 1, "kernels": [{"no": "id"}]}', id="wrong-shape"),
    ],
)
def test_an_unreadable_state_file_stops_the_gateway_naming_it(tmp_path, content):
    state_dir = tmp_path / "gateway"
    state_dir.mkdir()
    state_file = state_dir / "kernels.json"
    state_file.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "gateway", "--port", "0",
         "--state-dir", str(state_dir), "--token", "a-token-for-the-test"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert str(state_file) in result.stderr
    assert state_file.read_bytes() == content, "the operator decides what to do with it"
    assert [p.name for p in state_dir.iterdir() if p.name.startswith("kernels")] == ["kernels.json"]
