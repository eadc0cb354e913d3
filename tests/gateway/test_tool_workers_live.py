"""Tool workers on a live fleet (issue 15): a ``%%gpus 1`` cell runs ``%pipeline run`` on 4
workers, 3 of them started by the fleet on other GPUs (of its own host and another), trains
exactly as one process does, and leaves every GPU free; a fleet worker's death fails the run
naming it and its host; the API refuses what it must; the workers of a cell that ended are reaped.

One test on the shared fleet (3 hosts of 2 virtual GPUs), one kernel: workers import torch,
which costs seconds each on the test machine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernelfleet.testing import wait_for

NOTEBOOK = """
import copy, json, torch
from kernelfleet.client import FleetClient, FleetApiError
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
    torch.nn.Linear(16, 4),
)
x, y = torch.randn(12, 8), torch.randn(12, 4)
reference = copy.deepcopy(model)
fleet = FleetClient.from_environment()
"""

RUN = """%%gpus 1
import os
report = %pipeline run model x y --loss mse --schedule gpipe --microbatches 4 --steps 3 --lr 0.1 --stages 0-0,1-2,3-3,4-4 --hosts fleet
groups = fleet.workers()
print("RESULT", json.dumps({"gpus": os.environ["KERNELFLEET_GPUS"], "groups": groups, "notes": list(report.run.notes)}))
"""  # noqa: E501

CHECK = """
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
reference_losses = []
for _ in range(3):
    reference_optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(reference(x), y)
    loss.backward()
    reference_optimizer.step()
    reference_losses.append(loss.item())
torch.testing.assert_close(list(report.run.losses), reference_losses)
torch.testing.assert_close(dict(model.state_dict()), dict(reference.state_dict()))
print("trained as one process")
"""

FAILING = """%%gpus 1
def fatal_loss(output, target):
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
%pipeline run model x y --loss fatal_loss --schedule gpipe --microbatches 2 --stages 0-0,1-2,3-3,4-4
"""

REFUSALS = """%%gpus 1
MODULE = "kernelfleet.tools.pipeline.worker"
answers = {}
for name, call in {
    "too_many": lambda: fleet.start_workers(100, MODULE),
    "module": lambda: fleet.start_workers(1, "os"),
    "env": lambda: fleet.start_workers(1, MODULE, env={"LD_PRELOAD": "x"}),
    "other_kernel": lambda: fleet.request("GET", "/api/fleet/kernels/someone-else/workers"),
}.items():
    try:
        call()
        answers[name] = "accepted"
    except FleetApiError as e:
        answers[name] = [e.status, e.api_message]
print("RESULT", json.dumps(answers))
"""

LEFT_RUNNING = """
from kernelfleet.tools.pipeline.channel import Listener, TOKEN_ENV
listener = Listener("a-secret")
group = fleet.start_workers(1, "kernelfleet.tools.pipeline.worker",
                            args=[listener.host, str(listener.port), "0"],
                            env={TOKEN_ENV: "a-secret"})
waiting = listener.accept(60)  # the worker connected, and now waits for a session
group["held"] = [[host["id"], device["id"], device["held_for_workers"]]
                 for host in fleet.hosts() for device in host["gpus"]["devices"]
                 if device["held_for_workers"]]
print("RESULT", json.dumps(group))
"""


def result(reply: Any) -> Any:
    assert reply.reply["status"] == "ok", reply.reply
    text = "".join(m["content"]["text"] for m in reply.of_type("stream"))
    line = next(line for line in text.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def held_gpus(fleet: Any) -> int:
    """GPUs bound to cells or held for tool workers, fleet-wide (`committed`)."""
    return sum(host["gpus"]["committed"] for host in fleet.api("GET", "/api/fleet/hosts"))


@pytest.mark.slow
async def test_pipeline_workers_on_other_hosts_of_a_live_fleet(fleet: Any) -> None:
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(NOTEBOOK)
        assert setup.reply["status"] == "ok", setup.reply

        ran = result(await client.execute(RUN, timeout=240))
        (group,) = ran["groups"]
        assert group["state"] == "ended"
        # the workers leave when the driver closes; the run then deletes the group
        assert group["ended_why"] in ("deleted", "all its workers exited")
        workers = group["workers"]
        assert [w["index"] for w in workers] == [0, 1, 2]
        assert all(w["state"] == "exited" and w["exit_code"] == 0 for w in workers), workers
        hosts = [w["host"] for w in workers]
        # the cell's host first (its second GPU), then one host for the other two
        kernel = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        cell_host = kernel["recent_cells"][-1]["host"]
        assert hosts[0] == cell_host
        assert hosts[1] == hosts[2] != cell_host
        assert workers[0]["devices"] != [ran["gpus"]], "not the GPU the cell holds"
        assert ran["notes"][-1].startswith("fleet workers 1 on ")
        checked = await client.execute(CHECK)
        assert checked.reply["status"] == "ok", checked.reply
        wait_for(lambda: held_gpus(fleet) == 0, 15, "every GPU free after the run")

        # the last stage's worker, on another host, dies: its host's agent tells the gateway,
        # the run fails saying so, and every worker ends
        failing = await client.execute(FAILING, timeout=240)
        assert failing.reply["ename"] == "WorkerFailed"
        last = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}/workers")[-1]
        dead = last["workers"][2]
        assert failing.reply["evalue"] == (
            f"worker 3 died (signal 9) on host {dead['host']} (GPU {dead['devices'][0]})"
        )
        assert last["state"] == "ended"
        assert [w["state"] for w in last["workers"]] == ["exited"] * 3
        wait_for(lambda: held_gpus(fleet) == 0, 15, "every GPU free after the failed run")

        refused = result(await client.execute(REFUSALS))
        assert refused["too_many"][0] == 409
        assert "100 worker(s) of 1 GPU(s) need 100 GPUs; the fleet has 6" in refused["too_many"][1]
        assert refused["module"][0] == 400
        assert "module 'os' may not be started" in refused["module"][1]
        assert refused["env"][0] == 400
        assert refused["other_kernel"][0] == 403
        fleet.api("POST", "/api/fleet/kernels/no-such-kernel/workers", {"count": 1}, expect=404)
        body = {"count": 1, "module": "kernelfleet.tools.pipeline.worker"}
        idle = fleet.api("POST", f"/api/fleet/kernels/{kernel_id}/workers", body, expect=409)
        assert "runs no cell" in idle["message"]

        # a cell that ends leaves its workers behind: the gateway reaps them and frees the GPU
        started = result(await client.execute(LEFT_RUNNING, timeout=120))
        path = f"/api/fleet/kernels/{kernel_id}/workers/{started['id']}"
        (worker,) = started["workers"]
        holder = {"kernel_id": kernel_id, "group_id": started["id"]}
        assert started["held"] == [[worker["host"], worker["devices"][0], holder]]

        def reaped() -> bool:
            return fleet.api("GET", path)["state"] == "ended"

        wait_for(reaped, 30, "the workers of the ended cell reaped")
        ended = fleet.api("GET", path)
        assert ended["ended_why"].startswith("cell ")
        assert ended["ended_why"].endswith(" ended")
        assert ended["workers"][0]["state"] == "exited"
        wait_for(lambda: held_gpus(fleet) == 0, 15, "every GPU free after the reaping")
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
