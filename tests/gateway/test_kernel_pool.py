"""The warm pool: kernel starts served by pre-started, pre-joined replica groups.

Real gateway (with ``--GatewayApp.kernel_pool_size=2``), host agents, replica processes and
Raft groups. What the pool holds is read from the agents themselves: the replicas whose kernel
is not (yet) one of the gateway's kernels.
"""

import asyncio
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kernelfleet.privileges import kernel_uid
from kernelfleet.testing import call_json, pid_alive, wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

POOL = 2


def metric(fleet, name, labels=""):
    text = fleet.request_text("GET", "/metrics")
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert found, f"{name}{labels} missing from /metrics"
    return float(found.group(1))


def starts(fleet, source):
    return metric(fleet, "kernelfleet_kernel_starts_total", f'{{source="{source}"}}')


def pooled_replicas(fleet):
    """{kernel id: [replica model]} of the groups the pool holds now, from the agents."""
    kernels = {k["id"] for k in fleet.api("GET", "/api/kernels")}
    found: dict[str, list[dict]] = {}
    for host in fleet.api("GET", "/api/fleet/hosts"):
        status, replicas = call_json(host["address"] + "/api/replicas", token=fleet.token)
        assert status == 200, replicas
        for replica in replicas:
            if replica["kernel_id"] not in kernels and replica["state"] == "ready":
                found.setdefault(replica["kernel_id"], []).append(replica)
    return found


def wait_pool_full(fleet):
    def full():
        groups = pooled_replicas(fleet)
        whole = [g for g in groups.values() if len(g) == 3]
        return metric(fleet, "kernelfleet_kernel_pool_ready") == POOL and len(whole) >= POOL

    wait_for(full, 90, f"the pool to hold {POOL} ready groups")


@pytest.fixture(scope="module")
def pooled(fleet_factory):
    return fleet_factory(
        hosts=3, gpus=1, replicas=3, gateway_args=(f"--GatewayApp.kernel_pool_size={POOL}",)
    )


@pytest.fixture
def shared_folder():
    """A folder every kernel's user may create files in (as /tmp is)."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-pool-"))
    folder.chmod(0o1777)
    yield folder
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()


async def test_a_start_takes_a_pooled_group_binds_it_and_the_pool_refills(pooled, shared_folder):
    fleet = pooled
    wait_pool_full(fleet)
    held = set(pooled_replicas(fleet))
    before = starts(fleet, "pool")
    env = {"KERNEL_WORKING_DIR": str(shared_folder), "KERNEL_USERNAME": "alice"}
    asked = time.time()
    kernel_id = fleet.start_kernel(env=env)
    assert kernel_id in held, "the kernel is the pooled group, under the id it was started with"
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    assert view["started_from_pool"] is True
    assert view["user"] == "alice"
    assert view["last_activity"] >= asked, "active since its start, not since its launch"
    assert starts(fleet, "pool") == before + 1

    client = await fleet.connect(kernel_id)
    reply = await client.execute(
        "import os; open('made-here.txt', 'w').close()\n"
        "print(os.getcwd(), os.environ['KERNEL_USERNAME'])\nx = 41"
    )
    assert reply.stdout == f"{shared_folder} alice\n"
    assert (shared_folder / "made-here.txt").exists()
    assert (await client.execute("print(x + 1)")).stdout == "42\n"
    client.close()

    wait_pool_full(fleet)  # refilled in the background
    assert kernel_id not in pooled_replicas(fleet)
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_burst_larger_than_the_pool_starts_the_rest_cold(pooled):
    fleet = pooled
    wait_pool_full(fleet)
    cold_before, pool_before = starts(fleet, "cold"), starts(fleet, "pool")
    burst = POOL + 2
    ids: list[str] = []
    lock = threading.Lock()

    def start():
        kernel_id = fleet.start_kernel()
        with lock:
            ids.append(kernel_id)

    await asyncio.gather(*(asyncio.to_thread(start) for _ in range(burst)))
    views = [fleet.api("GET", f"/api/fleet/kernels/{k}") for k in ids]
    from_pool = sum(view["started_from_pool"] for view in views)
    assert from_pool >= POOL, "every group ready was taken"
    assert from_pool < burst, "the pool had fewer groups than the burst: some started cold"
    assert starts(fleet, "pool") - pool_before == from_pool
    assert starts(fleet, "cold") - cold_before == burst - from_pool
    for kernel_id in ids:
        client = await fleet.connect(kernel_id)
        assert (await client.execute("print(6 * 7)", timeout=60)).stdout == "42\n"
        client.close()
    for kernel_id in ids:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_pooled_replica_killed_while_idle_is_replaced_unseen(pooled):
    fleet = pooled
    wait_pool_full(fleet)
    groups = pooled_replicas(fleet)
    victim_kernel, replicas = next(iter(groups.items()))
    os.kill(replicas[0]["pid"], signal.SIGKILL)
    wait_for(lambda: not pid_alive(replicas[0]["pid"]), 10, "the pooled replica to die")

    def replaced():
        now = pooled_replicas(fleet)
        return victim_kernel not in now and len([g for g in now.values() if len(g) == 3]) >= POOL

    await asyncio.to_thread(wait_for, replaced, 90, "the dead pooled group to be replaced")
    wait_for(
        lambda: not any(pid_alive(r["pid"]) for r in replicas), 15, "its other replicas to stop"
    )
    assert re.search(
        rf"pooled group {victim_kernel} given up and replaced: its replica \S+ is dead",
        fleet.log("gateway"),
    )
    kernel_id = fleet.start_kernel()
    assert kernel_id != victim_kernel
    assert fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["started_from_pool"] is True
    client = await fleet.connect(kernel_id)
    assert (await client.execute("print('fine')")).stdout == "fine\n"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_pooled_kernels_keep_users_and_tokens_of_their_own(pooled):
    fleet = pooled
    wait_pool_full(fleet)
    first, second = fleet.start_kernel(), fleet.start_kernel()
    seen = {}
    for kernel_id in (first, second):
        assert fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["started_from_pool"] is True
        client = await fleet.connect(kernel_id)
        reply = await client.execute(
            "import os; print(os.getuid(), os.environ['KERNELFLEET_KERNEL_TOKEN'])"
        )
        uid, token = reply.stdout.split()
        seen[kernel_id] = (int(uid), token)
        client.close()
    (uid_a, token_a), (uid_b, token_b) = seen[first], seen[second]
    assert token_a != token_b
    assert uid_a != uid_b
    isolation = fleet.api("GET", "/api/fleet/hosts")[0]["isolation"]["kernel_user"]
    if isolation == "per-kernel":  # the agent runs as root: each kernel a user of its own
        assert (uid_a, uid_b) == (kernel_uid(first), kernel_uid(second))
    own = fleet.request("GET", f"/api/fleet/kernels/{first}", token=token_a)
    assert own[0] == 200
    other = fleet.request("GET", f"/api/fleet/kernels/{second}", token=token_a)
    assert other[0] == 403, "one pooled kernel's token reaches the other"
    for kernel_id in (first, second):
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_a_start_wanting_more_gpus_than_a_host_has_is_refused_as_before(pooled):
    fleet = pooled
    wait_pool_full(fleet)
    held = set(pooled_replicas(fleet))
    status, body = fleet.request(
        "POST", "/api/kernels", {"name": "python3", "env": {"KERNEL_GPUS": "2"}}
    )
    assert status == 400, body
    assert "GPU" in body["message"]
    assert set(pooled_replicas(fleet)) == held, "no pooled group was used up"


def test_a_pooled_groups_token_is_refused_until_a_start_takes_it(pooled):
    fleet = pooled
    wait_pool_full(fleet)
    kernel_id, replicas = next(iter(pooled_replicas(fleet).items()))
    environ = Path(f"/proc/{replicas[0]['pid']}/environ").read_bytes().split(b"\0")
    token = next(
        item.split(b"=", 1)[1].decode()
        for item in environ
        if item.startswith(b"KERNELFLEET_KERNEL_TOKEN=")
    )
    status, _ = fleet.request("GET", f"/api/fleet/kernels/{kernel_id}", token=token)
    assert status == 401, "the token of a group no start took yet grants nothing"
    status, _ = fleet.request("GET", f"/api/fleet/kernels/{kernel_id}")
    assert status == 404, "a pooled group is no kernel of the gateway's yet"


def test_a_fleet_without_a_pool_starts_every_kernel_cold(fleet_factory):
    fleet = fleet_factory(hosts=1, gpus=1, replicas=1)  # the suite's fleets run no pool
    kernel_id = fleet.start_kernel()
    assert fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["started_from_pool"] is False
    assert metric(fleet, "kernelfleet_kernel_pool_ready") == 0
    assert starts(fleet, "pool") == 0
    assert starts(fleet, "cold") == 1
    assert not pooled_replicas(fleet)
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_a_killed_gateways_pooled_group_is_stopped_by_the_next_one(fleet_factory):
    fleet = fleet_factory(
        hosts=1, gpus=1, replicas=1, gateway_args=("--GatewayApp.kernel_pool_size=1",)
    )
    wait_for(lambda: len(pooled_replicas(fleet)) == 1, 60, "a pooled group")
    ((left, (replica,)),) = pooled_replicas(fleet).items()
    fleet.restart_gateway(signal.SIGKILL)  # its pool is left running on the host
    wait_for(lambda: not pid_alive(replica["pid"]), 60, "the left pooled replica to be stopped")
    assert f"it is of pooled group {left}, which a previous gateway left" in fleet.log("gateway")
    wait_for(lambda: len(pooled_replicas(fleet)) == 1, 60, "the new gateway's own pooled group")
    assert left not in pooled_replicas(fleet)


def test_a_burst_of_starts_grows_the_pool_so_the_next_burst_is_served_from_it(fleet_factory):
    """``kernel_pool_max``: after a burst larger than the pool (its first start pooled, the
    others cold), the pool keeps as many groups as the burst had starts, up to the maximum, and
    a second burst like it is served from the pool entirely."""
    fleet = fleet_factory(
        hosts=1, gpus=1, replicas=1,
        gateway_args=("--GatewayApp.kernel_pool_size=1", "--GatewayApp.kernel_pool_max=3"),
    )  # fmt: skip

    def ready(count):
        wait_for(
            lambda: metric(fleet, "kernelfleet_kernel_pool_ready") == count, 90,
            f"the pool to hold {count} ready group(s)",
        )  # fmt: skip

    def burst():
        ids: list[str] = []

        def start_one():
            ids.append(fleet.api("POST", "/api/kernels", {"name": "python3"}, expect=201)["id"])

        threads = [threading.Thread(target=start_one) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return ids

    ready(1)
    assert metric(fleet, "kernelfleet_kernel_pool_target") == 1
    first = burst()
    assert (starts(fleet, "pool"), starts(fleet, "cold")) == (1, 2)
    ready(3)
    assert metric(fleet, "kernelfleet_kernel_pool_target") == 3
    second = burst()
    assert (starts(fleet, "pool"), starts(fleet, "cold")) == (4, 2)
    for kernel_id in first + second:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
