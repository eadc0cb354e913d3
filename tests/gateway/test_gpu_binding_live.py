"""GPUs bound only while a cell runs, through the live gateway (issue 4's acceptance).

A fleet of 3 hosts x 1 virtual GPU; every kernel runs 3 replicas, one per host, and asks for
1 GPU (``KERNEL_GPUS=1``). Virtual GPUs take the same path as real ones: the ledger, the
commitment, and ``KERNELFLEET_GPUS`` inside the cell.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from kernelfleet.protocol import ErrorName, gpu_request
from kernelfleet.testing import wait_for

SLEEP = (
    "import os, time\nprint('gpus', os.environ['KERNELFLEET_GPUS'], flush=True)\ntime.sleep({s})"
)


@pytest.fixture(scope="module")
def gpu_fleet(fleet_factory):
    return fleet_factory(hosts=3, gpus=1, replicas=3)


def committed(fleet):
    return sum(host["gpus"]["committed"] for host in fleet.api("GET", "/api/fleet/hosts"))


def metric(fleet, name):
    text = fleet.request_text("GET", "/metrics")
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


async def test_gpus_are_committed_only_while_cells_run(gpu_fleet):
    fleet = gpu_fleet
    kernels = [fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(2)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    assert committed(fleet) == 0, "idle kernels hold no GPU"
    sent = [c.send("execute_request", {"code": SLEEP.format(s=4)}) for c in clients]
    for client, msg_id in zip(clients, sent, strict=True):
        await client.wait_for_output(msg_id, "gpus")
    assert committed(fleet) == 2, "two running cells hold one GPU each"
    assert metric(fleet, "kernelfleet_committed_gpus") == 2
    results = [await c.collect(m, timeout=30) for c, m in zip(clients, sent, strict=True)]
    assert all(r.reply["status"] == "ok" for r in results)
    assert [r.stdout.split()[1] for r in results] == ["0", "0"], "each host's one device"
    hosts = {fleet.api("GET", f"/api/fleet/kernels/{k}")["executor"] for k in kernels}
    assert len(hosts) == 2
    wait_for(lambda: committed(fleet) == 0, 5, "the GPUs to come back")
    assert "kernelfleet_cell_start_delay_seconds_count" in fleet.request_text("GET", "/metrics")
    for client, kernel_id in zip(clients, kernels, strict=True):
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_cell_waits_for_a_gpu_visibly_and_an_interrupt_cancels_the_wait(gpu_fleet):
    fleet = gpu_fleet
    kernels = [fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(4)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    busy = [c.send("execute_request", {"code": SLEEP.format(s=3)}) for c in clients[:3]]
    for client, msg_id in zip(clients[:3], busy, strict=True):
        await client.wait_for_output(msg_id, "gpus")
    assert committed(fleet) == 3

    # A fourth cell has no GPU anywhere: it waits, and says why in its output.
    waiting = clients[3].send("execute_request", {"code": "x = 1; print('ran')"})
    wait_for(lambda: metric(fleet, "kernelfleet_queued_cells") == 1, 10, "the cell to queue")
    result = await clients[3].collect(waiting, timeout=30)
    lines = [m["content"]["data"]["text/plain"] for m in result.iopub if "data" in m["content"]]
    assert any("waiting for 1 GPU" in line for line in lines), lines
    assert result.reply["status"] == "ok", "it ran once a GPU was released"
    assert "ran" in result.stdout
    for client, msg_id in zip(clients[:3], busy, strict=True):
        await client.collect(msg_id, timeout=30)

    # Interrupting a waiting cell cancels it; the kernel goes on.
    busy = [c.send("execute_request", {"code": SLEEP.format(s=20)}) for c in clients[:3]]
    for client, msg_id in zip(clients[:3], busy, strict=True):
        await client.wait_for_output(msg_id, "gpus")
    waiting = clients[3].send("execute_request", {"code": "y = 2"})
    wait_for(lambda: metric(fleet, "kernelfleet_queued_cells") == 1, 10, "the cell to queue")
    fleet.api("POST", f"/api/kernels/{kernels[3]}/interrupt", expect=204)
    cancelled = await clients[3].collect(waiting, timeout=10)
    assert cancelled.reply["ename"] == ErrorName.INTERRUPTED
    for kernel_id in kernels[:3]:
        fleet.api("POST", f"/api/kernels/{kernel_id}/interrupt", expect=204)
    for client, msg_id in zip(clients[:3], busy, strict=True):
        await client.collect(msg_id, timeout=30)
    wait_for(lambda: committed(fleet) == 0, 5, "every GPU to come back")
    assert (await clients[3].execute("print(x)")).stdout == "1\n"

    # More GPUs than any host has: refused at once, with the reason.
    big = clients[3].send("execute_request", {"code": "1"}, metadata=gpu_request(2))
    refused = await clients[3].collect(big, timeout=10)
    assert refused.reply["ename"] == "NoCapacity"
    assert "more GPUs than any host has" in refused.reply["evalue"]
    for client, kernel_id in zip(clients, kernels, strict=True):
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    await asyncio.sleep(0)
