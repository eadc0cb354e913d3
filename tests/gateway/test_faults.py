"""Bad input and broken parts: the gateway logs, answers clearly, and keeps serving."""

import asyncio
import json
import signal
import sys
import time

import pytest

from kernelfleet.testing import wait_for

pytestmark = pytest.mark.timeout(120)

FORGE_IOPUB = """
import hmac, json, uuid
from hashlib import sha256
k = get_ipython().kernel
header = json.dumps({"msg_id": uuid.uuid4().hex, "msg_type": "stream", "session": "x",
                     "username": "x", "date": "2026-01-01T00:00:00Z", "version": "5.3"}).encode()
content = json.dumps({"name": "stdout", "text": "FORGED\\n"}).encode()
parts = [header, b"{}", b"{}", content]
bad = hmac.new(b"not-the-key", digestmod=sha256)
for p in parts: bad.update(p)
k.iopub_socket.send_multipart([b"stream", b"<IDS|MSG>", bad.hexdigest().encode(), *parts])
print("sent")
"""


async def test_malformed_frames_and_forged_messages_are_dropped_and_logged(fleet):
    victim_id, bystander_id = fleet.start_kernel(), fleet.start_kernel()
    victim, bystander = await fleet.connect(victim_id), await fleet.connect(bystander_id)
    try:
        victim.ws.write_message("{this is not json")
        victim.ws.write_message(
            json.dumps({"channel": "iopub", "header": {"msg_id": "1", "msg_type": "x"}})
        )
        victim.ws.write_message(b"\x00\x00\x00\x07garbage", binary=True)

        result = await victim.execute(FORGE_IOPUB)
        assert result.stdout == "sent\n"
        streams = [
            m for m in result.iopub + victim.unclaimed if m["header"]["msg_type"] == "stream"
        ]
        assert [m["content"]["text"] for m in streams] == ["sent\n"], (
            "the forged message got through"
        )
        assert (await bystander.execute("print('unaffected')")).stdout == "unaffected\n"

        wait_for(
            lambda: "failed its HMAC check" in fleet.log(), 10, "the bad signature to be logged"
        )
        log = fleet.log()
        assert "malformed-message" in log
        assert "not valid JSON" in log
        assert "unknown channel 'iopub'" in log
    finally:
        victim.close()
        bystander.close()
        fleet.api("DELETE", f"/api/kernels/{victim_id}", expect=204)
        fleet.api("DELETE", f"/api/kernels/{bystander_id}", expect=204)


@pytest.fixture
def failing_kernelspec(tmp_path):
    """A kernelspec whose process writes to stderr and exits, as a broken environment would."""
    spec_dir = tmp_path / "share" / "kernels" / "broken"
    spec_dir.mkdir(parents=True)
    argv = [
        sys.executable, "-c",
        "import sys; sys.stderr.write('boom: the environment is broken\\n'); sys.exit(3)",
        "{connection_file}",
    ]  # fmt: skip
    spec = {"argv": argv, "display_name": "Broken", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return {"JUPYTER_PATH": str(tmp_path / "share")}


def test_kernel_that_fails_to_start_reports_its_stderr_at_once(fleet_factory, failing_kernelspec):
    fleet = fleet_factory(hosts=1, gpus=0, env=failing_kernelspec)
    started = time.monotonic()
    status, body = fleet.request("POST", "/api/kernels", {"name": "broken"})
    elapsed = time.monotonic() - started
    assert status == 500
    assert body["reason"] == "kernel-start-failed"
    assert "boom: the environment is broken" in body["message"]
    assert elapsed < 20, f"the failure took {elapsed:.1f} s: it waited for the launch timeout"
    assert fleet.api("GET", "/api/kernels") == []
    assert fleet.start_kernel()  # the fleet still works


async def read_until_closed(ws):
    while await ws.read_message() is not None:
        pass


async def test_dead_host_shows_its_kernels_dead_and_the_gateway_keeps_serving(fleet_factory):
    fleet = fleet_factory(hosts=2, gpus=1)
    first, second = fleet.start_kernel(), fleet.start_kernel()
    placed = {
        k: fleet.api("GET", f"/api/fleet/kernels/{k}")["replicas"][0]["host"]
        for k in (first, second)
    }
    assert set(placed.values()) == {"host-1", "host-2"}, "replicas are spread over the hosts"
    doomed_kernel = next(k for k, h in placed.items() if h == "host-1")
    survivor = next(k for k, h in placed.items() if h == "host-2")
    watcher = await fleet.connect(doomed_kernel)

    fleet.signal_host("host-1", signal.SIGKILL)

    wait_for(lambda: fleet.host_state("host-1") == "lost", 20, "host-1 to be marked lost")
    replica = fleet.api("GET", f"/api/fleet/kernels/{doomed_kernel}")["replicas"][0]
    assert replica["state"] == "dead"
    assert fleet.api("GET", f"/api/kernels/{doomed_kernel}")["execution_state"] == "dead"
    statuses = []
    while "dead" not in statuses:
        msg = await watcher.receive(timeout=10)
        if msg["header"]["msg_type"] == "status":
            statuses.append(msg["content"]["execution_state"])

    healthy = await fleet.connect(survivor)
    assert (await healthy.execute("print(1 + 1)")).stdout == "2\n"
    healthy.close()
    assert fleet.api("GET", "/api/kernelspecs")["default"] == "python3"

    assert fleet.api("POST", f"/api/kernels/{doomed_kernel}/restart")["execution_state"] == "idle"
    replica = fleet.api("GET", f"/api/fleet/kernels/{doomed_kernel}")["replicas"][0]
    assert (replica["host"], replica["state"]) == ("host-2", "ready"), "re-placed on a live host"
    await asyncio.wait_for(read_until_closed(watcher.ws), 10)
    assert watcher.ws.close_code == 1012, "the old websocket is closed so its client reconnects"
    revived = await fleet.connect(doomed_kernel)
    assert (await revived.execute("print('revived')")).stdout == "revived\n"
    revived.close()


async def test_killed_kernel_process_is_reported_dead(fleet_factory):
    import os

    fleet = fleet_factory(hosts=1, gpus=0)
    kernel_id = fleet.start_kernel()
    pid = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "dead",
        10,
        "the kernel to be reported dead",
    )
    restarted = fleet.api("POST", f"/api/kernels/{kernel_id}/restart")
    assert restarted["execution_state"] == "idle"
    kernel = await fleet.connect(kernel_id)
    assert (await kernel.execute("print('back')")).stdout == "back\n"
    kernel.close()


def test_kernels_of_a_restarted_host_agent_are_reported_dead(fleet_factory):
    fleet = fleet_factory(hosts=1, gpus=0)
    kernel_id = fleet.start_kernel()
    fleet.signal_host("host-1", signal.SIGKILL)
    fleet.start_host("host-1", 0)  # back before the heartbeat timeout: never marked lost
    wait_for(
        lambda: fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "dead",
        10,
        "the old agent's kernel to be reported dead",
    )
    assert fleet.host_state("host-1") == "alive"
    assert fleet.api("POST", f"/api/kernels/{kernel_id}/restart")["execution_state"] == "idle"


async def test_a_restarted_gateway_adopts_the_kernels_it_left_running(fleet_factory):
    fleet = fleet_factory(hosts=2, gpus=0)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("survivor = 'still here'")).reply["status"] == "ok"
    client.close()

    fleet.restart_gateway(signal.SIGKILL)

    wait_for(
        lambda: [k["id"] for k in fleet.api("GET", "/api/kernels")] == [kernel_id],
        20,
        "the new gateway to adopt the kernel",
    )
    client = await fleet.connect(kernel_id)
    assert (await client.execute("print(survivor)")).stdout == "still here\n"
    client.close()
    assert "adopted from the previous gateway" in fleet.log()
