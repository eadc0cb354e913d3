"""The gateway driven by ``whole-hosts`` (docs/economics.md, "Placement that keeps hosts
whole"): loaded by name, and a cell stays on its previous executor where ``packing`` would move
it to a fuller host. 3 hosts x 2 virtual GPUs, 3 replicas a kernel (one per host)."""

from __future__ import annotations

import pytest

from kernelfleet.protocol import gpu_request

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SLEEP = (
    "import os, time\nprint('gpus', os.environ['KERNELFLEET_GPUS'], flush=True)\ntime.sleep(300)"
)


def last_cell_host(fleet, kernel_id: str) -> str:
    return fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["recent_cells"][-1]["host"]


def committed(fleet) -> dict[str, int]:
    return {h["id"]: h["gpus"]["committed"] for h in fleet.api("GET", "/api/fleet/hosts")}


async def test_a_cell_stays_on_its_previous_executor(private_fleet):
    fleet = private_fleet(hosts=3, gpus=2, replicas=3, gateway_args=["--policy", "whole-hosts"])
    assert fleet.api("GET", "/api/fleet")["policy"] == "whole-hosts"
    busy_id, kernel_id = (fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(2))
    busy, client = await fleet.connect(busy_id), await fleet.connect(kernel_id)

    # 1 GPU of host-1 held by a running cell (every host is free: the first by id)
    running = busy.send("execute_request", {"code": SLEEP})
    await busy.wait_for_output(running, "gpus")
    assert committed(fleet) == {"host-1": 1, "host-2": 0, "host-3": 0}

    # a 2-GPU cell fits host-2 or host-3 only: host-2, by id; it is now the executor
    wide = await client.execute("print('wide')", metadata=gpu_request(2))
    assert wide.reply["status"] == "ok", wide.reply
    assert last_cell_host(fleet, kernel_id) == "host-2"

    # a 1-GPU cell: packing would take host-1, the tightest fit (1 GPU idle); whole-hosts
    # keeps it on host-2, its previous executor, which can commit it
    narrow = await client.execute("print('narrow')")
    assert narrow.reply["status"] == "ok", narrow.reply
    assert last_cell_host(fleet, kernel_id) == "host-2"

    # the busy cell outlasts the test on any machine; deleting its kernel stops it
    for kernel, socket in ((busy_id, busy), (kernel_id, client)):
        socket.close()
        fleet.api("DELETE", f"/api/kernels/{kernel}", expect=204)
