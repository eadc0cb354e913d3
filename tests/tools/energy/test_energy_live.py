"""`%energy` in a live fleet kernel: the tuner sets the cell's GPU settings through the gateway
and the host agent (the fleet backend, over `FleetClient` and the kernel's own token), and the
agent puts the devices back once the cell ends.

One host with one virtual GPU, whose clocks and power limit are virtual too (validated, recorded
and reported by the agent); a virtual GPU has no energy counter, so the tuner minimises time.
"""

from __future__ import annotations

import pytest

from kernelfleet.testing import call_json

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

TUNE = """%%energy tune --slo 10s --knobs power_limit,gpu_clock --trials 6 --seed 1
import time
from kernelfleet.client import FleetClient
seen.append(FleetClient.from_environment().gpu_settings()["devices"][0]["current"])
time.sleep(0.01)
"""


def shown(result) -> str:
    """What the cell printed and displayed, as text."""
    parts = [result.stdout]
    for message in result.iopub:
        content = message["content"]
        if message["header"]["msg_type"] in ("display_data", "execute_result"):
            parts.append(content["data"].get("text/plain", ""))
        elif message["header"]["msg_type"] == "stream":
            parts.append(content["text"])
    return "\n".join(parts)


def agent_devices(fleet) -> list[dict]:
    host = fleet.api("GET", "/api/fleet/hosts")[0]
    status, body = call_json(host["address"] + "/api/gpu-settings", token=fleet.token)
    assert status == 200, body
    return body["devices"]


async def test_the_tuner_sets_the_cells_gpu_and_the_agent_resets_it_after(private_fleet):
    fleet = private_fleet(hosts=1, gpus=1, replicas=1)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("%gpus 1\nseen = []")).reply["status"] == "ok"

        dry = await client.execute(TUNE.replace("--seed 1", "--dry-run"), timeout=60)
        assert dry.reply["status"] == "ok", dry.reply
        assert "nvmlDeviceSetPowerManagementLimit" in shown(dry), shown(dry)

        tuned = await client.execute(TUNE, timeout=120)
        assert tuned.reply["status"] == "ok", tuned.reply
        assert "best under the slo" in shown(tuned).lower(), shown(tuned)
        assert "Warning" not in shown(dry) + shown(tuned), "no library noise in the output"
        found = await client.execute("print(len(seen), len({str(s) for s in seen}))")
        trials, distinct = map(int, found.stdout.split())
        assert trials >= 6, "the body ran once per trial"
        assert distinct > 1, "the trials ran under settings of their own"

        devices = agent_devices(fleet)
        assert all(d["owner"] is None and d["current"] == d["default"] for d in devices), devices

        measured = await client.execute("%%energy measure\nsum(range(10**6))")
        assert measured.reply["status"] == "ok", measured.reply
        assert "energy not measured" in shown(measured), shown(measured)
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
