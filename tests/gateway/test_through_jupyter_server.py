"""The Jupyter gateway contract, end to end: a real jupyter_server in gateway mode in front of a
real gateway, real host agents and real ipykernel kernels."""

import asyncio
import json

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.testing import V1_PROTOCOL, KernelWebsocket

pytestmark = pytest.mark.timeout(120)


async def start_kernel(jp_fetch, name="python3"):
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
    assert response.code == 201
    return json.loads(response.body)


@pytest.fixture(params=[V1_PROTOCOL, None], ids=["v1", "legacy"])
def framing(request):
    """Both websocket framings: v1, as JupyterLab offers it, and legacy."""
    return request.param


async def connect(jp_ws_fetch, kernel_id, framing=None):
    ws = await jp_ws_fetch(
        "api", "kernels", kernel_id, "channels",
        params={"session_id": "t"}, subprotocols=[framing] if framing else None,
    )  # fmt: skip
    client = KernelWebsocket(ws)
    assert client.protocol == framing, "the relay negotiates the framing the client offered"
    return client


async def test_kernelspecs_and_logo(jp_fetch):
    specs = json.loads((await jp_fetch("api", "kernelspecs")).body)
    assert specs["default"] == "python3"
    python3 = specs["kernelspecs"]["python3"]
    assert python3["spec"]["language"] == "python"
    assert "logo-64x64" in python3["resources"]
    logo = await jp_fetch("kernelspecs", "python3", "logo-64x64.png")
    assert logo.body.startswith(b"\x89PNG")


async def test_execute_stdout_display_and_errors(jp_fetch, jp_ws_fetch, fleet, framing):
    kernel = await start_kernel(jp_fetch)
    assert kernel["last_activity"].endswith("Z")
    kernel_ws = await connect(jp_ws_fetch, kernel["id"], framing)
    try:
        result = await kernel_ws.execute("print('hello from a fleet kernel'); x = 41")
        assert result.reply["status"] == "ok"
        assert result.stdout == "hello from a fleet kernel\n"

        result = await kernel_ws.execute(
            "from IPython.display import display, HTML; display(HTML('<b>bold</b>')); x + 1"
        )
        assert result.of_type("display_data")[0]["content"]["data"]["text/html"] == "<b>bold</b>"
        assert result.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "42"

        result = await kernel_ws.execute("1 / 0")
        assert result.reply["status"] == "error"
        assert result.reply["ename"] == "ZeroDivisionError"
        assert result.of_type("error")[0]["content"]["ename"] == "ZeroDivisionError"

        listed = json.loads((await jp_fetch("api", "kernels")).body)
        assert kernel["id"] in [k["id"] for k in listed]
        fleet_view = fleet.api("GET", f"/api/fleet/kernels/{kernel['id']}")
        assert fleet_view["executor"] == fleet_view["replicas"][0]["id"]
        assert fleet_view["replicas"][0]["state"] == "ready"
    finally:
        kernel_ws.close()
        await jp_fetch("api", "kernels", kernel["id"], method="DELETE")


async def test_interrupt_a_running_sleep(jp_fetch, jp_ws_fetch):
    kernel = await start_kernel(jp_fetch)
    kernel_ws = await connect(jp_ws_fetch, kernel["id"])
    try:
        code = "import time; print('sleeping', flush=True); time.sleep(60)"
        msg_id = kernel_ws.send("execute_request", {"code": code, "silent": False})
        await kernel_ws.wait_for_output(msg_id, "sleeping")
        await jp_fetch("api", "kernels", kernel["id"], "interrupt", method="POST", body="")
        result = await kernel_ws.collect(msg_id, timeout=20)
        assert result.reply["status"] == "error"
        assert result.reply["ename"] == "KeyboardInterrupt"
        assert (await kernel_ws.execute("print('still here')")).stdout == "still here\n"
    finally:
        kernel_ws.close()
        await jp_fetch("api", "kernels", kernel["id"], method="DELETE")


async def test_restart_clears_state_and_shutdown_removes(jp_fetch, jp_ws_fetch, fleet):
    kernel = await start_kernel(jp_fetch)
    pid_before = fleet.api("GET", f"/api/fleet/kernels/{kernel['id']}")["replicas"][0]["pid"]
    kernel_ws = await connect(jp_ws_fetch, kernel["id"])
    await kernel_ws.execute("secret = 7")
    kernel_ws.close()

    restarted = await jp_fetch("api", "kernels", kernel["id"], "restart", method="POST", body="")
    assert json.loads(restarted.body)["id"] == kernel["id"]
    assert (
        fleet.api("GET", f"/api/fleet/kernels/{kernel['id']}")["replicas"][0]["pid"] != pid_before
    )

    kernel_ws = await connect(jp_ws_fetch, kernel["id"])
    result = await kernel_ws.execute("secret")
    assert result.reply["ename"] == "NameError"
    kernel_ws.close()

    response = await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
    assert response.code == 204
    status, body = fleet.request("GET", f"/api/kernels/{kernel['id']}")
    assert status == 404
    assert body["reason"] == "not-found"


ECHO_TARGET = """
def _echo(comm, open_msg):
    @comm.on_msg
    def _reply(msg):
        reversed_buffers = [bytes(b)[::-1] for b in msg["buffers"]]
        comm.send({"echo": msg["content"]["data"]}, buffers=reversed_buffers)
get_ipython().kernel.comm_manager.register_target("echo", _echo)
"""


async def test_comm_round_trip_with_binary_buffers_both_ways(jp_fetch, jp_ws_fetch, framing):
    kernel = await start_kernel(jp_fetch)
    kernel_ws = await connect(jp_ws_fetch, kernel["id"], framing)
    try:
        assert (await kernel_ws.execute(ECHO_TARGET)).reply["status"] == "ok"
        kernel_ws.send("comm_open", {"comm_id": "c1", "target_name": "echo", "data": {}})
        payload = bytes(range(256)) * 40  # not valid UTF-8: must survive both relays
        result = await kernel_ws.request(
            "comm_msg",
            {"comm_id": "c1", "data": {"n": 1}},
            buffers=[payload, b"\x00abc"],
            expect_reply=False,
        )
        echoed = result.of_type("comm_msg")[0]
        assert echoed["content"]["data"] == {"echo": {"n": 1}}
        assert [bytes(b) for b in echoed["buffers"]] == [payload[::-1], b"cba\x00"]
    finally:
        kernel_ws.close()
        await jp_fetch("api", "kernels", kernel["id"], method="DELETE")


async def test_two_kernels_at_once_keep_their_own_state(jp_fetch, jp_ws_fetch):
    kernels = [await start_kernel(jp_fetch) for _ in range(2)]
    sockets = [await connect(jp_ws_fetch, k["id"]) for k in kernels]
    try:
        await asyncio.gather(*(ws.execute(f"who = {i}") for i, ws in enumerate(sockets)))
        results = await asyncio.gather(
            *(ws.execute("import time; time.sleep(0.5); print(who)") for ws in sockets)
        )
        assert [r.stdout for r in results] == ["0\n", "1\n"]
    finally:
        for ws in sockets:
            ws.close()
        for kernel in kernels:
            await jp_fetch("api", "kernels", kernel["id"], method="DELETE")


async def test_unknown_kernel_is_404_through_the_server(jp_fetch):
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch("api", "kernels", "00000000-0000-0000-0000-000000000000")
    assert error.value.code == 404
