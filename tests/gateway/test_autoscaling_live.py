"""The gateway's own autoscaler, live (issue 4's acceptance): it adds a host under sustained GPU
demand and removes an idle one, moving its replicas first.

Two hand-started hosts with one virtual GPU each; kernels run two replicas and ask for one GPU.
The autoscaler (notebookos's formula: hosts = ceil(demand GPUs / GPUs per host) + buffer, here
with no buffer host and no headroom) may grow the fleet to three hosts. Three cells at once
want three GPUs: the third waits, a host is added, a replica of the waiting kernel moves there
and the cell runs. Once everything is idle the added host is drained and stopped, and the moved
kernel keeps its state.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernelfleet.testing import Fleet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def release() -> Iterator[Path]:
    """Where a test drops the file that ends its held cells: a folder the kernels, which run
    under their own uids, can look into."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-release-"))
    folder.chmod(0o755)
    yield folder / "release"
    shutil.rmtree(folder, ignore_errors=True)


def held_cell(release: Path) -> str:
    """A cell that holds its GPU until `release` exists (at most two minutes): the test, not a
    timer, decides when the GPUs free up, so a slow host start cannot outlast the demand."""
    return (
        "import os, time\n"
        "print('gpus', os.environ['KERNELFLEET_GPUS'], flush=True)\n"
        "deadline = time.monotonic() + 120\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)"
    )


AUTOSCALING = (
    "--replicas", "2", "--autoscale", "--min-hosts", "2", "--max-hosts", "3",
    "--GatewayApp.autoscale_interval=0.3", "--GatewayApp.autoscale_patience=2",
    "--GatewayApp.autoscale_cooldown=0", "--GatewayApp.autoscale_buffer_hosts=0",
    "--GatewayApp.autoscale_headroom=1.0", "--GatewayApp.autoscale_gpus_per_host=1",
    "--GatewayApp.check_ledger=True",
)  # fmt: skip


def autoscaling_fleet(private_fleet: Callable[..., Fleet], *gateway_args: str) -> Fleet:
    """A gateway that autoscales between 2 and 3 hosts of 1 GPU, and 2 hand-started hosts."""
    return private_fleet(hosts=2, gpus=1, replicas=None, gateway_args=[*AUTOSCALING, *gateway_args])


@pytest.fixture
def scaling_fleet(private_fleet):
    return autoscaling_fleet(private_fleet)


def hosts(fleet: Fleet) -> dict[str, dict]:
    return {host["id"]: host for host in fleet.api("GET", "/api/fleet/hosts")}


def metric(fleet: Fleet, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", fleet.request_text("GET", "/metrics"), re.M)
    return float(found.group(1)) if found else 0.0


def replica_hosts(fleet: Fleet, kernel_id: str) -> set[str]:
    replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    return {replica["host"] for replica in replicas if replica["state"] != "dead"}


async def test_a_host_is_added_under_demand_and_removed_when_idle(scaling_fleet, release):
    fleet = scaling_fleet
    kernels = [fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(3)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    remembered = await clients[2].execute("state = 'kept'")
    assert remembered.reply["status"] == "ok"
    assert set(hosts(fleet)) == {"host-1", "host-2"}

    busy = [c.send("execute_request", {"code": held_cell(release)}) for c in clients[:2]]
    for client, msg_id in zip(clients[:2], busy, strict=True):
        await client.wait_for_output(msg_id, "gpus")
    late = clients[2].send(
        "execute_request", {"code": "import time\nprint('ran', state, flush=True)\ntime.sleep(2)"}
    )
    await clients[2].wait_for_output(late, "ran kept", timeout=60)
    assert "auto-1" in replica_hosts(fleet, kernels[2])
    assert hosts(fleet)["auto-1"]["gpus"]["committed"] == 1
    assert metric(fleet, "kernelfleet_scale_out_hosts_total") == 1
    result = await clients[2].collect(late, timeout=30)
    said = [m["content"]["data"]["text/plain"] for m in result.iopub if "data" in m["content"]]
    assert result.reply["status"] == "ok", result.reply
    assert any("waiting for 1 GPU" in line for line in said), said
    assert any("moving a replica to auto-1" in line for line in said), said
    release.touch()
    for client, msg_id in zip(clients[:2], busy, strict=True):
        assert (await client.collect(msg_id, timeout=30)).reply["status"] == "ok"

    # Idle again: the added host is drained (its replica moves) and stopped.
    wait_for(lambda: "auto-1" not in hosts(fleet), 60, "the added host to be removed")
    assert "auto-1" not in replica_hosts(fleet, kernels[2])
    assert len(replica_hosts(fleet, kernels[2])) == 2
    assert metric(fleet, "kernelfleet_scale_in_hosts_total") == 1
    assert metric(fleet, 'kernelfleet_migrations_total{outcome="succeeded"}') == 2
    assert metric(fleet, "kernelfleet_migration_seconds_count") == 2
    assert metric(fleet, "kernelfleet_scale_out_seconds_count") == 1
    autoscaling = fleet.api("GET", "/api/fleet")["autoscaling"]
    assert (autoscaling["min_hosts"], autoscaling["max_hosts"]) == (2, 3)
    assert autoscaling["hosts_started"] == []
    assert autoscaling["last_round"]["stopped"] == ["auto-1"]
    assert autoscaling["last_round"]["decision"] == "remove auto-1"
    again = await clients[2].execute("print('still', state)")
    assert again.reply["status"] == "ok"
    assert "still kept" in again.stdout
    assert sum(host["gpus"]["committed"] for host in hosts(fleet).values()) == 0
    assert metric(fleet, "kernelfleet_ledger_breaches_total") == 0
    assert "drained" in fleet.log("gateway")
    for client in clients:
        client.close()


@pytest.fixture
def ratio_fleet(private_fleet):
    """With a 2 s ratio window: busy GPUs weigh at once."""
    return autoscaling_fleet(
        private_fleet, "--GatewayApp.ratio_window=2", "--GatewayApp.usage_sample_interval=0.25"
    )


async def test_a_kernel_over_the_subscription_ratio_waits_for_a_new_host(ratio_fleet, release):
    fleet = ratio_fleet
    kernels = [fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(2)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    busy = [c.send("execute_request", {"code": held_cell(release)}) for c in clients]
    for client, msg_id in zip(clients, busy, strict=True):
        await client.wait_for_output(msg_id, "gpus")
    # Both GPUs busy, 4 GPUs subscribed: the cluster ratio is 2, and a third kernel would take
    # both hosts to 3. The kernel waits for the host the autoscaler adds, then starts there.
    wait_for(lambda: metric(fleet, "kernelfleet_subscription_ratio") == 2, 10, "the window to fill")
    third = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    # (the log, not the API: with no cooldown the idle new host may be drained right after)
    assert re.search(rf"kernel {third} \(python3\) started on .*auto-1", fleet.log()), fleet.log()
    assert metric(fleet, "kernelfleet_scale_out_hosts_total") == 1
    release.touch()
    for client, msg_id in zip(clients, busy, strict=True):
        assert (await client.collect(msg_id, timeout=30)).reply["status"] == "ok"
        client.close()
    assert metric(fleet, "kernelfleet_ledger_breaches_total") == 0
