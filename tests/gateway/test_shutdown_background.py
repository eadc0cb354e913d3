"""A shutdown answers once the kernel is gone from the table; its replicas stop afterwards,
and its GPUs go back only once they have.

Real gateway, host agents and replica processes. The kernel runs a cell that holds a GPU and
ignores SIGTERM, so its executor takes the agent's whole stop timeout (shutdown request, then
SIGTERM, then SIGKILL) to go: long after the DELETE has answered.
"""

import asyncio
import re

import pytest

from kernelfleet.testing import call_json, pid_alive, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

STUBBORN_CELL = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("holding", flush=True)
time.sleep(600)
"""


def committed_gpus(fleet):
    text = fleet.request_text("GET", "/metrics")
    found = re.search(r"^kernelfleet_committed_gpus (\S+)$", text, re.M)
    assert found, "kernelfleet_committed_gpus missing from /metrics"
    return float(found.group(1))


def agent_replicas_of(fleet, kernel_id):
    """The replicas the host agents themselves list for `kernel_id`."""
    found = []
    for host in fleet.api("GET", "/api/fleet/hosts"):
        status, replicas = call_json(host["address"] + "/api/replicas", token=fleet.token)
        assert status == 200, replicas
        found += [r for r in replicas if r["kernel_id"] == kernel_id]
    return found


@pytest.fixture(scope="module")
def gpu_fleet(fleet_factory):
    return fleet_factory(hosts=3, gpus=1, replicas=3)


async def test_shutdown_answers_first_and_frees_gpus_only_once_the_replicas_are_gone(gpu_fleet):
    fleet = gpu_fleet
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client = await fleet.connect(kernel_id)
    cell = client.send(
        "execute_request",
        {"code": STUBBORN_CELL, "silent": False, "store_history": True, "allow_stdin": False},
    )
    await client.wait_for_output(cell, "holding")
    assert committed_gpus(fleet) == 1
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    executor = next(r for r in view["replicas"] if r["id"] == view["executor"])
    pids = [r["pid"] for r in view["replicas"]]

    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert pid_alive(executor["pid"]), "the DELETE answered before the stopping ended"
    assert kernel_id not in {k["id"] for k in fleet.api("GET", "/api/kernels")}
    fleet.api("GET", f"/api/kernels/{kernel_id}", expect=404)

    def freed_only_after_exit() -> bool:
        committed = committed_gpus(fleet)  # first: a GPU freed now means the process went before
        alive = pid_alive(executor["pid"])
        assert not (committed == 0 and alive), "the GPU was given back while its process ran"
        return committed == 0

    await asyncio.to_thread(wait_for, freed_only_after_exit, 30, "the GPU to be given back")
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 10, "every replica to exit")
    assert not agent_replicas_of(fleet, kernel_id), "the agents still list its replicas"
    client.close()


async def test_a_kernel_started_after_a_shutdown_gets_the_freed_gpu(gpu_fleet):
    fleet = gpu_fleet
    first = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    fleet.api("DELETE", f"/api/kernels/{first}", expect=204)
    second = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client = await fleet.connect(second)
    reply = await client.execute("import os; print(os.environ['KERNELFLEET_GPUS'])", timeout=60)
    assert reply.reply["status"] == "ok"
    assert reply.stdout.strip(), "a GPU was bound to the cell"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{second}", expect=204)
