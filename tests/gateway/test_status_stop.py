"""A gateway that goes away, as JupyterLab sees it through a real jupyter_server in gateway
mode (with kernelfleet's relay): the cell running then fails with an error that says why, and
the kernel shows dead instead of staying "Idle" with the cell at ``[*]``: at once for a gateway
that stops (it shuts its kernels down), once the relay stops trying to reconnect for a gateway
killed with SIGKILL (it cannot say anything)."""

import json
import os
import signal

import pytest

from kernelfleet.extension.cells_in_flight import GATEWAY_UNREACHABLE
from kernelfleet.protocol import ErrorName
from kernelfleet.testing import V1_PROTOCOL, KernelWebsocket

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def own_fleet(private_fleet):
    """A fleet of this test's own: the test stops its gateway."""
    return private_fleet(hosts=1, gpus=0)


@pytest.fixture
def jp_server_config(own_fleet):
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {
            "url": own_fleet.url,
            "auth_token": own_fleet.token,
            # the relay gives a lost gateway 2 tries, 0.2 s then 0.4 s apart (default: 5, ~31 s)
            "gateway_retry_interval": 0.2,
            "gateway_retry_max": 2,
        },
    }


async def running_cell(jp_fetch, jp_ws_fetch) -> tuple[str, KernelWebsocket, str]:
    """A new kernel, a JupyterLab-like client of it, and the id of the cell it is running."""
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(response.body)["id"]
    ws = await jp_ws_fetch(
        "api", "kernels", kernel_id, "channels",
        params={"session_id": "lab"}, subprotocols=[V1_PROTOCOL],
    )  # fmt: skip
    client = KernelWebsocket(ws)
    code = "import time; print('running', flush=True); time.sleep(300)"
    msg_id = client.send("execute_request", {"code": code, "silent": False})
    await client.wait_for_output(msg_id, "running")
    return kernel_id, client, msg_id


async def statuses_until_closed(client: KernelWebsocket, timeout: float) -> list[str]:
    """The statuses `client` got with no parent, until its websocket closed; fails if it stays
    open, quiet, for `timeout` s."""
    seen = list(client.unclaimed)
    while True:
        try:
            seen.append(await client.receive(timeout))
        except ConnectionError:
            break
    return [
        m["content"]["execution_state"]
        for m in seen
        if m["header"]["msg_type"] == "status" and not m["parent_header"]
    ]


async def test_a_gateway_stopped_mid_cell_fails_the_cell_and_shows_the_kernel_dead(
    own_fleet, jp_fetch, jp_ws_fetch
):
    kernel_id, client, msg_id = await running_cell(jp_fetch, jp_ws_fetch)
    own_fleet.gateway.send_signal(signal.SIGTERM)

    result = await client.collect(msg_id, timeout=20)  # the deadline: within seconds
    assert result.reply["status"] == "error"
    assert result.reply["ename"] == ErrorName.KERNEL_UNAVAILABLE
    assert "the gateway stopped" in result.reply["evalue"]
    (error,) = result.of_type("error")  # what JupyterLab shows in the cell's output
    assert error["content"]["evalue"] == result.reply["evalue"]
    assert "dead" in await statuses_until_closed(client, timeout=10)
    client.close()
    assert own_fleet.gateway.wait(30) == 0

    # A gateway started again knows no such kernel: the server's DELETE is answered at once
    # (404, which jupyter_server takes as done), and the server forgets the kernel too.
    own_fleet.start_gateway(*own_fleet.gateway_args, port=int(own_fleet.url.rsplit(":", 1)[1]))
    response = await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert response.code == 204
    assert json.loads((await jp_fetch("api", "kernels")).body) == []


async def test_a_gateway_killed_mid_cell_fails_the_cell_then_shows_the_kernel_dead(
    own_fleet, jp_fetch, jp_ws_fetch
):
    kernel_id, client, msg_id = await running_cell(jp_fetch, jp_ws_fetch)
    os.killpg(own_fleet.gateway.pid, signal.SIGKILL)
    own_fleet.gateway.wait(10)

    result = await client.collect(msg_id, timeout=10)  # the deadline: within seconds
    assert result.reply["status"] == "error"
    assert result.reply["ename"] == GATEWAY_UNREACHABLE
    assert "lost its connection to the kernelfleet gateway" in result.reply["evalue"]
    (error,) = result.of_type("error")
    assert error["content"]["evalue"] == result.reply["evalue"]
    # Its 2 reconnection tries fail: the relay shows the kernel dead and closes the websocket.
    assert "dead" in await statuses_until_closed(client, timeout=15)

    # A gateway started again adopts the kernel, which the server can then shut down.
    own_fleet.start_gateway(*own_fleet.gateway_args, port=int(own_fleet.url.rsplit(":", 1)[1]))
    response = await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert response.code == 204


async def test_a_gateway_that_lets_its_kernels_run_on_fails_the_cell_and_says_so(private_fleet):
    """Straight to the gateway (no server between): its kernels outlive it, so its clients get
    no ``dead``, and the running cell's error says the kernel keeps running."""
    fleet = private_fleet(
        hosts=1, gpus=0, gateway_args=("--GatewayApp.stop_kernels_on_exit=False",)
    )
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    code = "import time; kept = 'yes'; print('running', flush=True); time.sleep(300)"
    msg_id = client.send("execute_request", {"code": code, "silent": False})
    await client.wait_for_output(msg_id, "running")
    fleet.gateway.send_signal(signal.SIGTERM)

    result = await client.collect(msg_id, timeout=20)
    assert result.reply["ename"] == ErrorName.KERNEL_UNAVAILABLE
    assert "the kernel keeps running" in result.reply["evalue"]
    assert len(result.of_type("error")) == 1
    assert "dead" not in await statuses_until_closed(client, timeout=10)
    assert fleet.gateway.wait(30) == 0
