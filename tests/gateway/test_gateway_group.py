"""A replicated gateway (docs/deploy.md, "A replicated gateway"): three members, the proxy in
front, host agents and clients reaching the gateway through the proxy only.

One member serves and the standbys name it; the serving member SIGKILLed mid-cell leaves a
standby serving within seconds with every kernel and its state, the cell run once; a member
cut off from its majority refuses writes and steps down, and the majority never sees them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

from kernelfleet.testing import V1_PROTOCOL, KernelWebsocket, kernel_reachable_folder, wait_for
from kernelfleet.testing.fleet import TOKEN
from kernelfleet.testing.gateway_group import MEMBERS, STANDS_BY, GatewayGroup
from kernelfleet.testing.http import call_json

pytestmark = pytest.mark.timeout(300)

SLOW_INCREMENT = """
import time
print("started", flush=True)
time.sleep(3)
x += 1
print("done", flush=True)
"""

JOB = {"source": "print('never run')\n", "gpus": 1, "steps": 1, "name": "refused"}


@pytest.fixture(scope="module")
def group() -> Iterator[GatewayGroup]:
    folder = kernel_reachable_folder()
    group = GatewayGroup.start(folder / "group")
    try:
        yield group
    finally:
        group.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_one_member_serves_and_the_standbys_name_it(group):
    serving = group.serving()
    assert serving is not None
    status, body = call_json(group.url(serving) + "/api/fleet/serving", token=TOKEN)
    assert (status, body["serving"], body["member"]) == (200, True, group.url(serving))
    for i in set(range(MEMBERS)) - {serving}:
        status, body = call_json(group.url(i) + "/api/kernels", token=TOKEN)
        assert status == 503
        assert body["reason"] == "not-serving"
        assert body["serving"] == group.url(serving)
        status, body = call_json(group.url(i) + "/api/kernels", token="")
        assert status == 401, "a standby wants the token too"
    assert group.fleet.api("GET", "/api/fleet/serving")["member"] == group.url(serving)


async def test_the_serving_gateway_killed_mid_cell_leaves_every_kernel_and_its_state(group):
    fleet = group.fleet
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("x = 41")).reply["status"] == "ok"
    msg_id = client.send("execute_request", {"code": SLOW_INCREMENT, "silent": False})
    await client.wait_for_output(msg_id, "started")

    old = group.serving()
    assert old is not None
    killed = time.monotonic()
    group.kill_member(old)
    wait_for(lambda: group.serving() not in (None, old), 30, "a standby to serve")
    serves_after = time.monotonic() - killed
    client.close()

    def kernel_adopted() -> bool:
        status, kernels = fleet.request("GET", "/api/kernels")
        return status == 200 and [k["id"] for k in kernels] == [kernel_id]

    wait_for(kernel_adopted, 60, "the new serving member to adopt the kernel")
    client = await fleet.connect(kernel_id)
    result = await client.execute("print(x)", timeout=90)
    usable_after = time.monotonic() - killed
    assert result.reply["status"] == "ok", result.reply
    assert result.stdout == "42\n", "the cell that ran across the failover ran exactly once"
    client.close()
    print(
        f"\ngateway failover: a standby serves {serves_after:.1f} s after the SIGKILL; "
        f"the kernel answers a cell {usable_after:.1f} s after it"
    )

    group.restart_member(old)
    assert group.serving() not in (None, old)
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


@pytest.fixture
def jp_server_config(group):
    """jupyter_server with kernelfleet's relay, its gateway URL the proxy's."""
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {"url": group.fleet.url, "auth_token": TOKEN},
    }


async def test_through_jupyter_server_a_cell_sent_during_a_failover_runs_once_one_serves(
    group, jp_fetch, jp_ws_fetch
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
        old = group.serving()
        assert old is not None
        group.kill_member(old)
        await asyncio.sleep(0.5)  # the relay hears of the loss
        msg_id = client.send("execute_request", {"code": "print(kept + 1)", "silent": False})
        result = await client.collect(msg_id, timeout=90)
        assert result.reply["status"] == "ok", result.reply
        assert result.stdout == "42\n"
        statuses = [m["content"] for m in client.unclaimed if m["header"]["msg_type"] == "status"]
        assert {"execution_state": "dead"} not in statuses
        group.restart_member(old)
    finally:
        client.close()
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")


def test_a_member_cut_off_from_its_majority_refuses_writes_and_the_majority_never_sees_them(
    group,
):
    serving = group.serving()
    assert serving is not None
    others = sorted(set(range(MEMBERS)) - {serving})
    standing_by = group.log(serving).count(STANDS_BY)
    for i in others:
        group.signal_member(i, signal.SIGSTOP)
    try:
        status, body = call_json(
            group.url(serving) + "/api/fleet/jobs", "POST", TOKEN, JOB, timeout=30
        )
        assert status == 503, body
        assert body["reason"] == "not-serving"
        wait_for(
            lambda: group.log(serving).count(STANDS_BY) > standing_by,
            30,
            "the member to step down and come back as a standby in a process of its own",
        )
        assert group.members[serving].poll() is None, "the same process, executed anew"
        group.kill_member(serving)  # the majority goes on without it
    finally:
        for i in others:
            group.signal_member(i, signal.SIGCONT)
    wait_for(lambda: group.serving() in others, 30, "one of the majority to serve")
    assert group.fleet.api("GET", "/api/fleet/jobs")["jobs"] == [], "the refused job is not kept"
    group.restart_member(serving)
    assert group.fleet.api("GET", "/api/fleet/jobs")["jobs"] == [], "nor brought back by it"
