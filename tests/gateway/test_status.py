"""What JupyterLab is told about its kernel, through a real jupyter_server in gateway mode: a
restart the user asks for looks like a local kernel's restart, not like a crash; a kernel that
dies fails its running cell and shows dead.

JupyterLab reads an IOPub ``status: restarting`` as "the server restarted a kernel that died"
and shows "The kernel appears to have died. It will restart automatically."; jupyter_server
sends it for a local kernel only when its restarter revived a dead one, never for a restart
asked for through ``POST /api/kernels/{id}/restart``.
"""

import asyncio
import json
import os
import signal
import time

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.protocol import ErrorName
from kernelfleet.testing import V1_PROTOCOL, KernelWebsocket

pytestmark = pytest.mark.timeout(120)


async def start_kernel(jp_fetch):
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    return json.loads(response.body)


async def connect(jp_ws_fetch, kernel_id):
    ws = await jp_ws_fetch(
        "api", "kernels", kernel_id, "channels",
        params={"session_id": "lab"}, subprotocols=[V1_PROTOCOL],
    )  # fmt: skip
    return KernelWebsocket(ws)


async def drain(client: KernelWebsocket, until: asyncio.Future) -> list[dict]:
    """Every message `client` receives until `until` is done and the socket is quiet."""
    seen: list[dict] = []
    while True:
        try:
            seen.append(await client.receive(timeout=1.0))
        except TimeoutError:
            if until.done():
                return seen
        except ConnectionError:
            return seen


def statuses(messages: list[dict]) -> list[str]:
    return [
        m["content"]["execution_state"] for m in messages if m["header"]["msg_type"] == "status"
    ]


async def test_a_user_restart_sends_no_restarting_status_and_the_kernel_works_on(
    jp_fetch, jp_ws_fetch
):
    kernel = await start_kernel(jp_fetch)
    client = await connect(jp_ws_fetch, kernel["id"])
    try:
        await client.execute("secret = 7")
        restart = asyncio.ensure_future(
            jp_fetch("api", "kernels", kernel["id"], "restart", method="POST", body="")
        )
        seen = await drain(client, restart)
        assert (await restart).code == 200
        assert "restarting" not in statuses(seen), "JupyterLab would show a crash dialog"
        assert "dead" not in statuses(seen)

        # On the websocket that saw the restart, and on a new one (JupyterLab reconnects).
        for ws in (client, await connect(jp_ws_fetch, kernel["id"])):
            result = await ws.execute("print(1 + 1); secret")
            assert result.stdout == "2\n"
            assert result.reply["ename"] == "NameError", "a restart empties the namespace"
            ws.close()
    finally:
        client.close()
        await jp_fetch("api", "kernels", kernel["id"], method="DELETE")


async def test_deleting_a_kernel_the_gateway_no_longer_knows_is_quick(jp_fetch, fleet):
    """After a fleet restart the server may hold kernels the gateway never heard of: the
    gateway answers their DELETE at once with 404, which jupyter_server takes as done."""
    kernel = await start_kernel(jp_fetch)
    fleet.api("DELETE", f"/api/kernels/{kernel['id']}", expect=204)  # behind the server's back
    started = time.monotonic()
    status, body = fleet.request("DELETE", f"/api/kernels/{kernel['id']}")
    assert (status, body["reason"]) == (404, "not-found")
    response = await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
    assert response.code == 204
    assert time.monotonic() - started < 10
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch("api", "kernels", kernel["id"])
    assert error.value.code == 404


async def test_a_kernel_that_dies_mid_cell_fails_the_cell_and_shows_dead(
    jp_fetch, jp_ws_fetch, fleet
):
    kernel = await start_kernel(jp_fetch)
    client = await connect(jp_ws_fetch, kernel["id"])
    try:
        code = "import time; print('running', flush=True); time.sleep(300)"
        msg_id = client.send("execute_request", {"code": code, "silent": False})
        await client.wait_for_output(msg_id, "running")
        (replica,) = fleet.api("GET", f"/api/fleet/kernels/{kernel['id']}")["replicas"]
        os.kill(replica["pid"], signal.SIGKILL)

        result = await client.collect(msg_id, timeout=20)  # the deadline: within seconds
        assert (result.reply["status"], result.reply["ename"]) == ("error", ErrorName.REPLICA_LOST)
        assert "the kernel's last replica died" in result.reply["evalue"]
        (error,) = result.of_type("error")  # what JupyterLab shows in the cell's output
        assert error["content"]["evalue"] == result.reply["evalue"]
        deadline = time.monotonic() + 10
        while "dead" not in statuses(client.unclaimed):
            client.unclaimed.append(await client.receive(deadline - time.monotonic()))
    finally:
        client.close()
        await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
