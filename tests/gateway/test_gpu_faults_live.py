"""GPU faults through the live gateway (issue 4, "Bad input"), with the ledger checked after
every event (``KERNELFLEET_CHECK_LEDGER=1``): each test ends with no breach counted in
``kernelfleet_ledger_breaches_total`` and the committed GPUs back at what is running.

Two fleets: 4 hosts x 1 virtual GPU with 3 replicas per kernel (bad requests, a migration for
GPUs, the executor's host lost mid-cell), and 3 hosts x 2 GPUs with one-replica kernels (hosts
reporting fewer GPUs than before).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernelfleet.protocol import ErrorName, gpu_request
from kernelfleet.testing import pid_alive, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

CHECKED = {"KERNELFLEET_CHECK_LEDGER": "1"}
HOLD = "import os, time\nprint('gpus', os.environ['KERNELFLEET_GPUS'], flush=True)\ntime.sleep({s})"


@pytest.fixture(scope="module")
def replicated(fleet_factory):
    return fleet_factory(hosts=4, gpus=1, replicas=3, env=CHECKED)


@pytest.fixture(scope="module")
def plain(fleet_factory):
    """Agents without their link to the gateway: these tests pause an agent and send its
    reports by hand, or restart it, and check what its heartbeats make of that (with the link,
    a paused or killed agent's host is lost at once: tests/gateway/test_hosts_*.py)."""
    return fleet_factory(
        hosts=3,
        gpus=2,
        replicas=1,
        env=CHECKED,
        host_args=("--HostAgentApp.link_to_gateway=False",),
    )


def hosts(fleet):
    return {host["id"]: host for host in fleet.api("GET", "/api/fleet/hosts")}


def committed(fleet):
    return {host_id: host["gpus"]["committed"] for host_id, host in hosts(fleet).items()}


def metric(fleet, sample):
    text = fleet.request_text("GET", "/metrics")
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert found, f"{sample} missing from /metrics"
    return float(found.group(1))


def assert_consistent(fleet):
    """No breach so far, and no host shows more committed GPUs than it has."""
    assert "the GPU ledger checks its invariants after every change" in fleet.log()
    assert metric(fleet, "kernelfleet_ledger_breaches_total") == 0, fleet.log()[-3000:]
    for host in hosts(fleet).values():
        gpus = host["gpus"]
        assert 0 <= gpus["committed"] <= gpus["total"], host
        assert gpus["subscribed"] >= 0, host


def replica_hosts(fleet, kernel_id):
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    return {replica["host"]: replica["id"] for replica in view["replicas"]}


def executor_host(fleet, kernel_id):
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    return {replica["id"]: replica["host"] for replica in view["replicas"]}[view["executor"]]


def gateway_lines(result):
    """What the gateway told the user in a cell's output (``cell.say``)."""
    return [m["content"]["data"]["text/plain"] for m in result.iopub if "data" in m["content"]]


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "two", "1.5", "²", "1e3"])
def test_a_kernel_gpus_that_is_not_a_non_negative_integer_is_400(replicated, value):
    status, body = replicated.request("POST", "/api/kernels", {"env": {"KERNEL_GPUS": value}})
    assert (status, body["reason"]) == (400, "invalid-request"), body
    assert f"KERNEL_GPUS must be a non-negative integer, not {value!r}" in body["message"]


async def test_a_bad_per_cell_gpu_count_fails_that_cell_at_once_and_the_kernel_goes_on(replicated):
    fleet = replicated
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client = await fleet.connect(kernel_id)
    assert (await client.execute("kept = 5")).reply["status"] == "ok"
    for gpus, ename, complaint in [
        (99, "NoCapacity", "needs 99 GPU(s) on one host; the largest has 1"),
        (-1, "InvalidRequest", "kernelfleet.gpus must be a non-negative integer, not -1"),
        ("2", "InvalidRequest", "not '2'"),
        (1.5, "InvalidRequest", "not 1.5"),
        (True, "InvalidRequest", "not True"),
    ]:
        msg_id = client.send("execute_request", {"code": "kept += 1"}, metadata=gpu_request(gpus))
        result = await client.collect(msg_id, timeout=5)
        assert (result.reply["status"], result.reply["ename"]) == ("error", ename), gpus
        assert complaint in result.reply["evalue"], result.reply["evalue"]
    assert (await client.execute("print(kept)")).stdout == "5\n", "no refused cell ran"
    assert sum(committed(fleet).values()) == 0
    assert_consistent(fleet)
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


# ---- more demand than GPUs: migrate --------------------------------------------------------------


async def test_a_cell_whose_replica_hosts_are_busy_moves_a_replica_to_a_free_gpu(replicated):
    fleet = replicated
    kernel_a = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client_a = await fleet.connect(kernel_a)
    assert (await client_a.execute("state = 41")).reply["status"] == "ok"
    busy_hosts = set(replica_hosts(fleet, kernel_a))
    (free,) = set(hosts(fleet)) - busy_hosts

    # Three other kernels, each with its replicas on exactly A's hosts (moved there if placed
    # on the free one), each running a cell: A's three hosts are busy, the fourth is not.
    others = [fleet.start_kernel(env={"KERNEL_GPUS": "1"}) for _ in range(3)]
    moves = []
    for kernel_id in others:
        placed = replica_hosts(fleet, kernel_id)
        if free in placed:
            (missing,) = busy_hosts - set(placed)
            path = f"/api/fleet/kernels/{kernel_id}/replicas/{placed[free]}/migrate"
            moves.append((path, {"host": missing}))
    with ThreadPoolExecutor(len(moves) or 1) as pool:  # the moves are independent
        list(pool.map(lambda move: fleet.api("POST", *move), moves))
    assert all(set(replica_hosts(fleet, kernel_id)) == busy_hosts for kernel_id in others)
    moved = 'kernelfleet_migrations_total{outcome="succeeded"}'
    migrations = metric(fleet, moved)
    clients = [await fleet.connect(kernel_id) for kernel_id in others]
    running = []
    for client in clients:
        running.append(client.send("execute_request", {"code": HOLD.format(s=30)}))
        await client.wait_for_output(running[-1], "gpus")
    assert committed(fleet) == {**dict.fromkeys(busy_hosts, 1), free: 0}

    result = await client_a.execute(HOLD.format(s=0) + "\nprint(state + 1)", timeout=40)
    assert result.reply["status"] == "ok", result.reply
    assert result.stdout.endswith("42\n"), "the moved replica kept the kernel's state"
    assert any(f"moving a replica to {free}" in line for line in gateway_lines(result))
    assert free in replica_hosts(fleet, kernel_a)
    assert executor_host(fleet, kernel_a) == free
    assert metric(fleet, moved) == migrations + 1

    for kernel_id, client, msg_id in zip(others, clients, running, strict=True):
        fleet.api("POST", f"/api/kernels/{kernel_id}/interrupt", expect=204)
        assert (await client.collect(msg_id, timeout=10)).reply["ename"] == "KeyboardInterrupt"
    wait_for(lambda: sum(committed(fleet).values()) == 0, 5, "every GPU to come back")
    assert_consistent(fleet)
    for kernel_id, client in zip([kernel_a, *others], [client_a, *clients], strict=True):
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


# ---- the executor's host is lost while its cell holds a GPU ------------------------------------


async def test_the_executors_host_lost_mid_cell_gives_its_gpu_back(replicated):
    fleet = replicated
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client = await fleet.connect(kernel_id)
    assert (await client.execute("kept = 7")).reply["status"] == "ok"
    msg_id = client.send("execute_request", {"code": HOLD.format(s=60)})
    await client.wait_for_output(msg_id, "gpus")
    lost = executor_host(fleet, kernel_id)
    assert committed(fleet)[lost] == 1

    fleet.signal_host(lost, signal.SIGKILL)
    failed = await client.collect(msg_id, timeout=20)
    assert (failed.reply["status"], failed.reply["ename"]) == ("error", ErrorName.REPLICA_LOST)
    wait_for(lambda: sum(committed(fleet).values()) == 0, 5, "the lost cell's GPU to come back")
    assert hosts(fleet)[lost]["state"] == "lost"

    msg_id = client.send("execute_request", {"code": HOLD.format(s=1) + "\nprint(kept)"})
    await client.wait_for_output(msg_id, "gpus")
    now = committed(fleet)
    assert (sum(now.values()), now[lost]) == (1, 0), now
    result = await client.collect(msg_id, timeout=20)
    assert result.stdout.endswith("7\n"), result.reply
    assert executor_host(fleet, kernel_id) != lost
    wait_for(lambda: sum(committed(fleet).values()) == 0, 5, "the GPU to come back")
    assert_consistent(fleet)
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


# ---- hosts that report fewer GPUs than before ---------------------------------------------------


def agent_report(fleet, host_id):
    """The host agent's own report (``GET /api/host``), as it heartbeats it."""
    request = urllib.request.Request(
        hosts(fleet)[host_id]["address"] + "/api/host",
        headers={"Authorization": f"token {fleet.token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


async def test_hosts_restarted_with_fewer_gpus_idle_and_under_a_running_cell(plain):
    """An idle agent restarts (same id, ``--gpus 1``): the host counts 1 GPU. Another does
    while a cell holds both of its GPUs: the kernel is dead and its GPUs and claim leave the
    ledger; its running cell ends with an error, and a later cell fails at once."""
    fleet = plain
    fleet.signal_host("host-3", signal.SIGTERM)
    fleet.start_host("host-3", 1)
    wait_for(lambda: hosts(fleet)["host-3"]["gpus"]["total"] == 1, 10, "host-3's new report")
    gpus = hosts(fleet)["host-3"]["gpus"]
    devices = gpus.pop("devices")
    assert gpus == {
        "total": 1, "subscribed": 0, "committed": 0, "vanished": [], "over_committed": False,
        "type": "virtual",
    }  # fmt: skip
    assert [(d["id"], d["lent_to_job"], d["relative_speed"]) for d in devices] == [("0", None, 1.0)]
    assert_consistent(fleet)

    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "2"})
    (host_id,) = replica_hosts(fleet, kernel_id)
    client = await fleet.connect(kernel_id)
    msg_id = client.send("execute_request", {"code": HOLD.format(s=60)})
    await client.wait_for_output(msg_id, "gpus 0,1")
    assert committed(fleet)[host_id] == 2

    fleet.signal_host(host_id, signal.SIGKILL)
    fleet.start_host(host_id, 1)
    wait_for(lambda: hosts(fleet)[host_id]["gpus"]["total"] == 1, 20, "the host's new report")
    wait_for(
        lambda: (
            fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"][0]["state"] == "dead"
        ),
        10,
        "the kernel's replica to be dead",
    )
    gpus = hosts(fleet)[host_id]["gpus"]
    assert (gpus["committed"], gpus["subscribed"]) == (0, 0), gpus
    # The new agent (a new address) is refused while the old one may still be alive; once
    # that one missed its heartbeats, its host is lost, its GPUs leave the ledger, and the new
    # agent registers the host again.
    assert f"host {host_id} was lost" in fleet.log()
    failed = await client.collect(msg_id, timeout=5)
    assert failed.reply["ename"] == ErrorName.REPLICA_LOST
    assert f"last replica died: host {host_id} was lost" in failed.reply["evalue"]
    later = await client.execute("1", timeout=5)
    assert later.reply["ename"] == "KernelDead"
    assert "has no live replica" in later.reply["evalue"]
    assert_consistent(fleet)
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_gpu_vanishing_under_a_running_cell_is_over_committed_until_released(plain):
    """A host whose report loses a GPU a cell holds (as when a device falls off the bus; the
    agent reads its inventory once, so the test sends that report while the agent is paused):
    the host is over-committed, never negative, until the cell ends; a cell needing more GPUs
    than any host now has fails at once; the GPU coming back makes it usable again."""
    fleet = plain
    big = max(hosts(fleet).values(), key=lambda host: host["gpus"]["total"])["id"]
    assert [h["gpus"]["total"] for h in hosts(fleet).values()].count(2) == 1, "one 2-GPU host"
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "2"})
    assert set(replica_hosts(fleet, kernel_id)) == {big}
    small = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    client, other = await fleet.connect(kernel_id), await fleet.connect(small)
    msg_id = client.send("execute_request", {"code": "kept = 3\n" + HOLD.format(s=6)})
    await client.wait_for_output(msg_id, "gpus 0,1")

    report = agent_report(fleet, big)
    report["gpus"] = report["gpus"][:1]
    agent = fleet.hosts[big].pid
    os.kill(agent, signal.SIGSTOP)
    beating = threading.Event()

    def beat():
        while not beating.wait(0.5):
            fleet.api("PUT", f"/api/fleet/hosts/{big}", report)

    fleet.api("PUT", f"/api/fleet/hosts/{big}", report)
    beats = threading.Thread(target=beat, daemon=True)
    beats.start()
    try:
        wait_for(lambda: hosts(fleet)[big]["gpus"]["total"] == 1, 5, "the shrunk report")
        gpus = hosts(fleet)[big]["gpus"]
        assert (gpus["total"], gpus["committed"]) == (1, 1), gpus
        assert (gpus["vanished"], gpus["over_committed"]) == (["1"], True), gpus
        assert f"host {big} no longer reports GPU(s) 1" in fleet.log()
        assert_consistent(fleet)

        refused = await other.execute("1", timeout=5, metadata=gpu_request(2))
        assert refused.reply["ename"] == "NoCapacity"
        assert "the largest has 1" in refused.reply["evalue"]

        result = await client.collect(msg_id, timeout=20)
        assert result.reply["status"] == "ok", "the cell kept its vanished GPU to the end"
        gpus = hosts(fleet)[big]["gpus"]
        assert gpus == {**gpus, "total": 1, "committed": 0, "vanished": [], "over_committed": False}
        assert_consistent(fleet)
    finally:
        beating.set()
        beats.join()
        os.kill(agent, signal.SIGCONT)

    wait_for(lambda: hosts(fleet)[big]["gpus"]["total"] == 2, 10, "the GPU to come back")
    result = await client.execute(HOLD.format(s=0) + "\nprint(kept)", timeout=20)
    assert result.stdout == "gpus 0,1\n3\n", result.reply
    wait_for(lambda: sum(committed(fleet).values()) == 0, 5, "the GPUs to come back")
    assert_consistent(fleet)
    for client_, kernel in [(client, kernel_id), (other, small)]:
        client_.close()
        fleet.api("DELETE", f"/api/kernels/{kernel}", expect=204)
    await asyncio.sleep(0)


async def test_a_replica_given_up_for_dead_is_stopped_when_its_host_comes_back(plain):
    """A host silent past the heartbeat timeout is lost and its replicas are declared dead
    (their GPUs go back to the pool). If it comes back, those replicas must not keep running
    on GPUs the ledger hands to others: the gateway stops them."""
    fleet = plain
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    ((host_id, _),) = replica_hosts(fleet, kernel_id).items()
    (replica,) = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    agent = fleet.hosts[host_id].pid
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_for(lambda: hosts(fleet)[host_id]["state"] == "lost", 15, "the host to be lost")
    finally:
        os.kill(agent, signal.SIGCONT)
    wait_for(lambda: hosts(fleet)[host_id]["state"] == "alive", 10, "the host to come back")
    assert fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "dead"
    wait_for(lambda: not pid_alive(replica["pid"]), 15, "the stray to stop")
    assert f"still runs replica {replica['id']}, given up for dead" in fleet.log()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert_consistent(fleet)
