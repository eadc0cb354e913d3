"""A gateway killed and started again within the relay's reconnection attempts, as JupyterLab
sees it through jupyter_server with kernelfleet's relay: nothing is shown dead, and a cell sent
while the gateway was away runs once the relay has reconnected."""

import asyncio
import json
import os
import signal

import pytest

from kernelfleet.testing import V1_PROTOCOL, KernelWebsocket

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def own_fleet(private_fleet):
    return private_fleet(hosts=1, gpus=0)


@pytest.fixture
def jp_server_config(own_fleet):
    """The relay's default reconnection attempts: 5, from 1 s apart (about 30 s in all)."""
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {"url": own_fleet.url, "auth_token": own_fleet.token},
    }


async def test_a_cell_sent_while_the_gateway_restarts_runs_once_it_is_back(
    own_fleet, jp_fetch, jp_ws_fetch
):
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(response.body)["id"]
    ws = await jp_ws_fetch(
        "api", "kernels", kernel_id, "channels",
        params={"session_id": "lab"}, subprotocols=[V1_PROTOCOL],
    )  # fmt: skip
    client = KernelWebsocket(ws)
    try:
        assert (await client.execute("kept = 41")).reply["status"] == "ok"
        os.killpg(own_fleet.gateway.pid, signal.SIGKILL)
        own_fleet.gateway.wait(10)
        await asyncio.sleep(0.5)  # the relay hears of the loss
        msg_id = client.send("execute_request", {"code": "print(kept + 1)", "silent": False})
        own_fleet.start_gateway(*own_fleet.gateway_args, port=int(own_fleet.url.rsplit(":", 1)[1]))

        result = await client.collect(msg_id, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        assert result.stdout == "42\n"
        statuses = [m["content"] for m in client.unclaimed if m["header"]["msg_type"] == "status"]
        assert {"execution_state": "dead"} not in statuses
    finally:
        client.close()
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
