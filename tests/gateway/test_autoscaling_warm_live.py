"""The gateway's autoscaler keeps warm capacity for the cells to come (docs/economics.md, "Warm
capacity"), live: the same rule the simulator runs, fed by the cells the gateway sees.

Two hand-started hosts of one GPU, and a kernel of one GPU. Its cells end at once, so no GPU is
ever committed for long and the reactive rule never asks for a third host. With a warm target
(the 0.9 quantile of the GPUs that cells arriving within 600 s need, from the rate of the last
900 s), three cells make the autoscaler add a host with nothing waiting.
"""

from __future__ import annotations

import asyncio

import pytest

from kernelfleet.testing import wait_for

from .test_autoscaling_live import autoscaling_fleet, hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WARM = ("--GatewayApp.autoscale_warm_quantile=0.9", "--GatewayApp.autoscale_warm_lead=600")


async def test_cells_that_came_make_the_autoscaler_keep_a_host_ready_for_those_to_come(
    private_fleet,
):
    fleet = autoscaling_fleet(private_fleet, *WARM)
    assert "keeps idle the GPUs of the cells arriving within 600 s" in fleet.log("gateway")
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    await asyncio.sleep(1.5)  # several rounds (0.3 s, patience 2) with no cell yet
    assert set(hosts(fleet)) == {"host-1", "host-2"}, "no cell came: nothing to keep warm"

    client = await fleet.connect(kernel_id)
    for n in range(3):  # 3 cells in 900 s, over 600 s: 2 expected; at the 0.9 quantile, 4 GPUs
        reply = await client.execute(f"x = {n}")
        assert reply.reply["status"] == "ok"
    wait_for(lambda: "auto-1" in hosts(fleet), 60, "a host added for the cells to come")
    autoscaling = fleet.api("GET", "/api/fleet")["autoscaling"]
    assert autoscaling["hosts_started"] == ["auto-1"]
    assert fleet.api("GET", "/api/fleet")["gpus"]["committed"] == 0, "no cell holds a GPU"
    client.close()
