"""GPU clocks and power limits from a notebook, through the live gateway and host agent.

One host with 2 virtual GPUs (their settings are virtual too: validated, recorded, reported by
the agent); kernels of one replica. A ``%%gpus 1`` cell sets a power limit with `FleetClient`
and its kernel token; the agent's own API (fleet token) shows what stays changed on the host.
"""

from __future__ import annotations

import contextlib
import signal

import pytest

from kernelfleet.testing import call_json, pid_alive, wait_for

pytestmark = pytest.mark.timeout(180)

SET_AND_READ = """%%gpus 1
from kernelfleet.client import FleetClient
client = FleetClient.from_environment()
dry = client.set_gpu_settings(power_limit_w=150, gpu_clock_mhz=1005, dry_run=True)
print("dry", dry["dry_run"], dry["devices"][0]["calls"])
client.set_gpu_settings(power_limit_w=200)
device = client.gpu_settings()["devices"][0]
print("set", device["uuid"], device["current"]["power_limit_w"], device["changed"], flush=True)
"""

REFUSED = """%%gpus 1
from kernelfleet.client import FleetClient, FleetApiError
client = FleetClient.from_environment()
for knobs in ({"power_limit_w": 9000}, {"gpu_clock_mhz": 1001}, {"power_limit_w": 200}):
    try:
        client.set_gpu_settings(**knobs)
    except FleetApiError as e:
        print("refused", e.status, e.reason, e.api_message)
"""

HOLD = """%%gpus 1
import time
from kernelfleet.client import FleetClient
FleetClient.from_environment().set_gpu_settings(gpu_clock_mhz=705, power_limit_w=120)
print("holding", flush=True)
time.sleep(120)
"""

TOKEN = "import os; print(os.environ['KERNELFLEET_KERNEL_TOKEN'])"


@pytest.fixture(scope="module")
def fleet(fleet_factory):
    return fleet_factory(hosts=1, gpus=2, replicas=1)


@contextlib.asynccontextmanager
async def kernel(fleet, delete=True):
    kernel_id = fleet.start_kernel()
    ws = await fleet.connect(kernel_id)
    try:
        ws.kernel_id = kernel_id
        yield ws
    finally:
        ws.close()
        if delete:
            fleet.request("DELETE", f"/api/kernels/{kernel_id}")


def agent_devices(fleet) -> dict[str, dict]:
    """The host's devices as its agent reports them (current values, owner), by UUID."""
    hosts = wait_for(lambda: fleet.api("GET", "/api/fleet/hosts"), 15, "the host to register")
    status, body = call_json(hosts[0]["address"] + "/api/gpu-settings", token=fleet.token)
    assert status == 200, body
    return {device["uuid"]: device for device in body["devices"]}


def untouched(fleet) -> bool:
    return all(
        d["owner"] is None and d["changed"] == {} and d["current"] == d["default"]
        for d in agent_devices(fleet).values()
    )


async def test_a_cell_sets_a_power_limit_reads_it_back_and_its_end_resets_it(fleet):
    async with kernel(fleet) as ws:
        result = await ws.execute(SET_AND_READ)
        assert result.reply["status"] == "ok", result.reply
        lines = result.stdout.splitlines()
        assert lines[0] == (
            "dry True ['nvmlDeviceSetGpuLockedClocks(0, 1005, 1005)', "
            "'nvmlDeviceSetPowerManagementLimit(0, 150000)']"
        )
        _, uuid, power, changed = lines[1].split(" ", 3)
        assert float(power) == 200.0
        assert changed == "{'power_limit_w': 200.0}"
        assert uuid in agent_devices(fleet)
        wait_for(lambda: untouched(fleet), 10, "the agent to reset the GPU after the cell")


async def test_out_of_range_values_are_400_and_the_message_lists_the_range(fleet):
    async with kernel(fleet) as ws:
        result = await ws.execute(REFUSED)
        refused = [line for line in result.stdout.splitlines() if line.startswith("refused")]
        assert len(refused) == 2, result.stdout
        assert "400 invalid-request" in refused[0]
        assert "100 to 400 W" in refused[0]
        assert "gpu_clock_mhz=1001 is not supported" in refused[1]
        assert "from 210 to 1410 MHz" in refused[1]
    wait_for(lambda: untouched(fleet), 10, "the valid one reset after the cell")


async def test_without_a_running_cell_holding_gpus_it_is_409_no_gpus_bound(fleet):
    async with kernel(fleet) as ws:
        path = f"/api/fleet/kernels/{ws.kernel_id}/gpu-settings"
        for method, body in (("GET", None), ("PUT", {"power_limit_w": 200})):
            status, answer = fleet.request(method, path, body)
            assert status == 409, answer
            assert answer["reason"] == "no-gpus-bound"
        status, _ = fleet.request("DELETE", path)
        assert status == 204, "nothing to reset"
        status, answer = fleet.request("GET", "/api/fleet/kernels/nope/gpu-settings")
        assert status == 404
        status, answer = fleet.request("PUT", path, {"sm_clock_mhz": 1})
        assert status == 400
        assert "known: gpu_clock_mhz, mem_clock_mhz, power_limit_w" in answer["message"]


async def test_a_kernel_token_reaches_its_own_kernels_gpus_only(fleet):
    async with kernel(fleet) as mine, kernel(fleet) as other:
        token = (await mine.execute(TOKEN)).stdout.strip()
        path = f"/api/fleet/kernels/{other.kernel_id}/gpu-settings"
        for method, body in (("GET", None), ("PUT", {"power_limit_w": 200}), ("DELETE", None)):
            status, answer = fleet.request(method, path, body, token=token)
            assert status == 403, answer
            assert answer["reason"] == "forbidden"
        own = f"/api/fleet/kernels/{mine.kernel_id}/gpu-settings"
        status, answer = fleet.request("GET", own, token=token)
        assert (status, answer["reason"]) == (409, "no-gpus-bound"), "its own: allowed"


async def test_a_kernel_deleted_mid_cell_has_its_gpus_reset(fleet):
    async with kernel(fleet, delete=False) as ws:
        msg_id = ws.send("execute_request", {"code": HOLD})
        await ws.wait_for_output(msg_id, "holding")
        changed = [d["changed"] for d in agent_devices(fleet).values() if d["changed"]]
        assert changed == [{"gpu_clock_mhz": 705, "power_limit_w": 120.0}]
        fleet.api("DELETE", f"/api/kernels/{ws.kernel_id}", expect=204)
        wait_for(lambda: untouched(fleet), 10, "the GPU reset after the kernel went")


@pytest.mark.slow
async def test_settings_of_a_cell_a_restarted_gateway_never_knew_of_are_reset(fleet):
    """A gateway killed mid-cell: the cell runs on, but the new gateway holds no binding for it
    (it may bind those devices to another cell), so the devices it changed are reset at once,
    from the agent's heartbeat, though the replica still runs."""
    async with kernel(fleet) as ws:
        msg_id = ws.send("execute_request", {"code": HOLD})
        await ws.wait_for_output(msg_id, "holding")
        assert not untouched(fleet)
        fleet.restart_gateway(signal.SIGKILL)
        wait_for(lambda: untouched(fleet), 15, "the GPU reset after the gateway restarted")
        replica = fleet.api("GET", f"/api/fleet/kernels/{ws.kernel_id}")["replicas"][0]
        assert pid_alive(replica["pid"]), "reset while the replica and its cell run on"


@pytest.fixture(scope="module")
def not_root(fleet_factory):
    """A host agent that may not change its GPUs (as NVML refuses an agent that is not root)."""
    return fleet_factory(
        hosts=1, gpus=1, replicas=1,
        host_args=("--HostAgentApp.virtual_gpu_settings_permitted=False",),
    )  # fmt: skip


async def test_no_permission_is_a_clear_403_and_nothing_changes(not_root):
    async with kernel(not_root) as ws:
        result = await ws.execute(REFUSED.replace("9000", "150"))
        refused = [line for line in result.stdout.splitlines() if line.startswith("refused")]
        assert refused, result.stdout
        assert "403 permission-denied" in refused[0]
        assert "Insufficient Permissions" in refused[0]
        assert untouched(not_root)
