"""What a frontend sees of a replicated kernel that a plain IPython kernel shows differently:
its kernel_info, subshell requests, comms across an executor change, and shutdown_request.

On a 3-host fleet whose kernels have 3 replicas, through the gateway's websocket."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import IPython
import pytest

from kernelfleet import __version__
from kernelfleet.testing import KernelWebsocket, pid_alive, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def fleet3(fleet_factory):
    return fleet_factory(hosts=3, gpus=0, replicas=3)


async def next_message(client: KernelWebsocket, wanted, timeout: float = 30) -> dict[str, Any]:
    """The first message (already received or arriving) for which `wanted(msg)` is true."""
    for index, msg in enumerate(client.unclaimed):
        if wanted(msg):
            return client.unclaimed.pop(index)
    deadline = time.monotonic() + timeout
    while True:
        msg = await client.receive(max(0.01, deadline - time.monotonic()))
        if wanted(msg):
            return msg
        client.unclaimed.append(msg)


def comm_close_for(comm_id: str):
    def wanted(msg: dict[str, Any]) -> bool:
        return msg["header"]["msg_type"] == "comm_close" and msg["content"]["comm_id"] == comm_id

    return wanted


async def test_kernel_info_is_ipythons_with_kernelfleet_beside_it(fleet3):
    kernel_id = fleet3.start_kernel()
    client = await fleet3.connect(kernel_id)
    try:
        await client.execute("1")  # joined its group: it knows its replicas
        info = (await client.request("kernel_info_request", {})).reply
        assert info["implementation"] == "ipython"
        assert info["implementation_version"] == IPython.__version__
        assert info["kernelfleet"] == {"version": __version__, "replicas": 3}
        assert "kernel subshells" not in info["supported_features"]
        assert "debugger" not in info["supported_features"]
        assert info["debugger"] is False

        for request in ("create_subshell_request", "list_subshell_request"):
            reply = (await client.request(request, {}, channel="control")).reply
            assert reply["status"] == "error", reply
            assert reply["ename"] == "SubshellsUnsupported"

        debug = {"type": "request", "seq": 1, "command": "initialize", "arguments": {}}
        reply = (await client.request("debug_request", debug, channel="control")).reply
        assert reply["success"] is False
        assert reply["command"] == "initialize"
    finally:
        client.close()
        fleet3.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_comms_of_a_lost_executor_are_closed_for_the_frontend(fleet3):
    kernel_id = fleet3.start_kernel()
    client = await fleet3.connect(kernel_id)
    try:
        opened = await client.execute("from comm import create_comm\nc = create_comm('probe')")
        assert opened.reply["status"] == "ok"
        (comm_open,) = [m for m in opened.iopub if m["header"]["msg_type"] == "comm_open"]
        comm_id = comm_open["content"]["comm_id"]

        # a comm it holds is reached: a message to it is not answered with a close
        client.send("comm_msg", {"comm_id": comm_id, "data": {}})
        never = client.send("comm_msg", {"comm_id": "never-opened", "data": {}})
        closed = await next_message(client, comm_close_for("never-opened"))
        assert closed["parent_header"]["msg_id"] == never
        assert "no replica" in closed["content"]["data"]["reason"]

        model = fleet3.api("GET", f"/api/fleet/kernels/{kernel_id}")
        (executor,) = [r for r in model["replicas"] if r["id"] == model["executor"]]
        os.kill(executor["pid"], signal.SIGKILL)

        closed = await next_message(client, comm_close_for(comm_id), timeout=30)
        assert "was lost" in closed["content"]["data"]["reason"]

        # the frontend's message to the closed comm: told again, not silence
        later = client.send("comm_msg", {"comm_id": comm_id, "data": {}})
        again = await next_message(client, comm_close_for(comm_id))
        assert again["parent_header"]["msg_id"] == later
        assert (await client.execute("print(2 + 2)", timeout=60)).stdout == "4\n"
    finally:
        client.close()
        fleet3.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_shutdown_request_stops_every_replica_and_removes_the_kernel(fleet3):
    kernel_id = fleet3.start_kernel()
    client = await fleet3.connect(kernel_id)
    try:
        await client.execute("1")
        pids = [r["pid"] for r in fleet3.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]]
        assert len(pids) == 3
        msg_id = client.send("shutdown_request", {"restart": False}, channel="control")
        reply = await next_message(
            client,
            lambda m: m["channel"] == "control" and m["parent_header"].get("msg_id") == msg_id,
        )
        assert reply["header"]["msg_type"] == "shutdown_reply"
        assert reply["content"] == {"status": "ok", "restart": False}

        def gone() -> bool:
            return kernel_id not in [k["id"] for k in fleet3.api("GET", "/api/kernels")]

        wait_for(gone, 30, "the kernel to leave the gateway's list")
        wait_for(lambda: not any(pid_alive(p) for p in pids), 30, "every replica to stop")
    finally:
        client.close()


async def test_shutdown_request_with_restart_restarts_the_whole_kernel(fleet3):
    kernel_id = fleet3.start_kernel()
    client = await fleet3.connect(kernel_id)
    try:
        await client.execute("x = 1")
        before = {r["id"] for r in fleet3.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]}
        msg_id = client.send("shutdown_request", {"restart": True}, channel="control")
        reply = await next_message(
            client,
            lambda m: m["channel"] == "control" and m["parent_header"].get("msg_id") == msg_id,
        )
        assert reply["content"] == {"status": "ok", "restart": True}

        def restarted() -> set[str] | None:
            model = fleet3.api("GET", f"/api/fleet/kernels/{kernel_id}")
            ready = {r["id"] for r in model["replicas"] if r["state"] == "ready"}
            return ready if len(ready) == 3 and not ready & before else None

        wait_for(restarted, 60, "three new replicas")
        client.close()
        # A client that connects while the gateway links the new replicas meets a link without
        # them (KernelDead): a platform race of any restart, left to the restart's owners.
        deadline = time.monotonic() + 30
        while True:
            client = await fleet3.connect(kernel_id)
            reply = await client.execute("print('x' in dir())", timeout=60)
            if reply.reply.get("ename") != "KernelDead" or time.monotonic() > deadline:
                break
            client.close()
            await asyncio.sleep(0.5)
        assert reply.stdout == "False\n", reply.reply
    finally:
        client.close()
        fleet3.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
