"""Replicated kernels: three replicas kept in step by Raft, and the loss of the executing one.

Real gateway, host agents, ReplicatedKernel processes and pysyncobj groups. A host is lost by
SIGKILL of its agent (its kernels then exit, as ipykernel polls its parent).
"""

import asyncio
import signal
import time

import pytest

from kernelfleet.protocol import ErrorName
from kernelfleet.testing import pid_alive, wait_for, wait_until
from kernelfleet.testing.replicas import agreed_executors, replica_digest, replica_status

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

STATE = """
import numpy as np
count, name, config = 41, "fleet", {"lr": 0.1, "layers": [64, 32]}
weights = np.full(100 * 2**20 // 8, 0.5)       # 100 MB: travels through the object store
def scale(v):
    return v * count
class Model:
    def __init__(self, depth):
        self.depth = depth
    def describe(self):
        return f"{name}:{self.depth}"
model = Model(3)
print("state set")
"""
CHECK = (
    "print(count + 1, name, config['layers'], weights.sum(), scale(2), model.describe(), np.pi > 3)"
)
EXPECTED = "42 fleet [64, 32] 6553600.0 82 fleet:3 True\n"


def executor_host(fleet, kernel_id):
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    hosts = {replica["id"]: replica["host"] for replica in view["replicas"]}
    return hosts[view["executor"]]


async def read_until_closed(ws):
    while await ws.read_message() is not None:
        pass


@pytest.fixture(scope="module")
def replicated(fleet_factory):
    return fleet_factory(hosts=4, gpus=1, replicas=3)


async def test_restart_gives_a_fresh_group_and_shutdown_stops_every_replica(replicated):
    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("secret = 7; print(secret)")).stdout == "7\n"
    before = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]

    assert fleet.api("POST", f"/api/kernels/{kernel_id}/restart")["execution_state"] == "idle"
    await asyncio.wait_for(read_until_closed(client.ws), 10)
    after = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    assert len(after) == 3
    assert not {r["id"] for r in after} & {r["id"] for r in before}, "new replicas, new group"
    wait_for(lambda: not any(pid_alive(r["pid"]) for r in before), 10, "the old replicas to exit")
    client = await fleet.connect(kernel_id)
    assert (await client.execute("secret")).reply["ename"] == "NameError"
    assert (await client.execute("fresh = 1; print(fresh)")).stdout == "1\n"
    client.close()

    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    wait_for(lambda: not any(pid_alive(r["pid"]) for r in after), 10, "every replica to exit")


CELLS = [
    "a = 1",
    "b = [a, 2, 3]",
    "import math\nc = {'pi': math.pi}",
    "a += 10",
    "def grow(v):\n    return v * 2",
    "b.append(grow(a))",
    "arr = np.arange(200_000)",
    "del c",
    "class Point:\n    def __init__(self, x):\n        self.x = x",
    "p = Point(a)",
    "arr = arr * 3",
    "s = {'x', 'y', 'z'}",
    "try:\n    1 / 0\nexcept ZeroDivisionError:\n    err = 'caught'",
    "del b",
    "b = tuple(range(5))",
    "big = np.ones(300_000)",
    "del big",
]


async def test_replicas_hold_equal_namespaces_after_many_cells(replicated):
    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("import numpy as np")).reply["status"] == "ok"
    first = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"][0]
    before = await replica_digest(fleet, first)
    for code in CELLS:
        assert (await client.execute(code)).reply["status"] == "ok", code
    client.close()
    replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    digests = [await replica_digest(fleet, replica) for replica in replicas]
    assert len(set(digests)) == 1, dict(zip([r["id"] for r in replicas], digests, strict=True))
    assert digests[0] != before, "the cells changed the synced state"
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_follower_lost_mid_cell_is_replaced_and_nothing_is_lost(replicated):
    import os

    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    assert (await client.execute("total = 0")).reply["status"] == "ok"
    executor = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"]
    follower = next(r for r in view["replicas"] if r["id"] != executor)

    code = "import time\nprint('busy', flush=True)\ntime.sleep(2)\ntotal += 5\nprint(total)"
    msg_id = client.send("execute_request", {"code": code})
    await client.wait_for_output(msg_id, "busy")
    os.kill(follower["pid"], signal.SIGKILL)
    result = await client.collect(msg_id, timeout=30)
    assert result.reply["status"] == "ok", "the executor finishes; 2 of 3 is still a majority"
    assert result.stdout == "busy\n5\n"

    def replaced():
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        ids = {r["id"] for r in replicas}
        return follower["id"] not in ids and all(r["state"] == "ready" for r in replicas)

    wait_for(replaced, 30, "the lost follower to be replaced")
    assert (await client.execute("total += 1; print(total)")).stdout == "6\n"
    replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    digests = {await replica_digest(fleet, replica) for replica in replicas}
    assert len(digests) == 1, "the replacement holds the same state"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_an_isolated_replica_refuses_cells_and_a_suspended_one_catches_up(replicated):
    """Isolation is approximated by suspending processes (SIGSTOP), not by cutting links."""
    import os

    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("n = 1")).reply["status"] == "ok"
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    executor = next(r for r in view["replicas"] if r["id"] == view["executor"])
    others = [r for r in view["replicas"] if r["id"] != view["executor"]]

    # A minority replica falls behind and catches up.
    os.kill(others[0]["pid"], signal.SIGSTOP)
    try:
        for _ in range(3):
            assert (await client.execute("n += 1")).reply["status"] == "ok"
    finally:
        os.kill(others[0]["pid"], signal.SIGCONT)

    async def caught_up():
        return len({await replica_digest(fleet, r) for r in view["replicas"]}) == 1

    await wait_until(caught_up, 10, "the resumed replica to catch up", interval=0.2)

    # The executor cut off from both others cannot run a cell: it refuses, and the gateway
    # sends the cell to another replica, which runs it once the group has a majority again.
    for replica in others:
        os.kill(replica["pid"], signal.SIGSTOP)
    try:
        msg_id = client.send("execute_request", {"code": "n = 1000"})

        def sent_elsewhere():
            view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
            running = [r["id"] for r in view["replicas"] if r["state"] == "executing"]
            return running and running[0] != executor["id"]

        wait_for(sent_elsewhere, 20, "the isolated executor to refuse the cell")
    finally:
        for replica in others:
            os.kill(replica["pid"], signal.SIGCONT)
    result = await client.collect(msg_id, timeout=30)
    assert result.reply["status"] == "ok", result.reply
    assert (await client.execute("print(n)", timeout=30)).stdout == "1000\n"
    executors = await agreed_executors(fleet, live_replicas(fleet, kernel_id), {msg_id})
    assert executors[msg_id] != executor["id"], "the isolated replica did not run it"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_replica_migrates_to_a_named_host_and_the_kernel_keeps_its_state(replicated):
    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("kept = [1, 2, 3]")).reply["status"] == "ok"
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    used = {replica["host"] for replica in view["replicas"]}
    hosts = fleet.api("GET", "/api/fleet/hosts")
    free = next(h["id"] for h in hosts if h["state"] == "alive" and h["id"] not in used)
    moving = view["executor"]
    path = f"/api/fleet/kernels/{kernel_id}/replicas"

    status, body = fleet.request("POST", f"{path}/{moving}/migrate", {"host": sorted(used)[0]})
    assert (status, body["reason"]) == (409, "conflict")
    status, body = fleet.request("POST", f"{path}/nope/migrate", {})
    assert (status, body["reason"]) == (404, "not-found")

    moved = fleet.api("POST", f"{path}/{moving}/migrate", {"host": free})
    assert moving not in {replica["id"] for replica in moved["replicas"]}
    assert free in {replica["host"] for replica in moved["replicas"]}
    assert all(replica["state"] == "ready" for replica in moved["replicas"])
    assert (await client.execute("kept.append(4); print(kept)")).stdout == "[1, 2, 3, 4]\n"
    assert executor_host(fleet, kernel_id) == free, "the executor's successor runs the kernel"
    replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    digests = {await replica_digest(fleet, replica) for replica in replicas}
    assert len(digests) == 1, "a newcomer that executed a cell leaves every replica equal"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_the_executor_leads_its_raft_group_through_an_executor_change_mid_stream(replicated):
    """Issue 16: the replica that runs the cells takes its group's Raft leadership, so its two
    commits per cell skip the hop to another leader (kernels/replica/leadership.py). A stream of
    cells goes on while the executor migrates away: every cell runs once, in order, on one
    replica all agree on, and the new executor takes the leadership in turn."""
    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    path = f"/api/fleet/kernels/{kernel_id}"
    ran: list[str] = []

    async def cell(code: str) -> str:
        msg_id = client.send("execute_request", {"code": code, "silent": False})
        result = await client.collect(msg_id, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        ran.append(msg_id)
        return result.stdout

    async def executor_leads() -> tuple[str, bool]:
        view = fleet.api("GET", path)
        executor = next(r for r in view["replicas"] if r["id"] == view["executor"])
        return executor["host"], (await replica_status(fleet, executor))["raft"]["is_leader"]

    async def cells_until_the_executor_leads() -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await cell("seen.append(len(seen))")
            host, leads = await executor_leads()
            if leads:
                return host
            await asyncio.sleep(0.2)
        raise AssertionError(f"the executor on {host} never took the Raft leadership")

    await cell("seen = []")
    first_host = await cells_until_the_executor_leads()

    view = fleet.api("GET", path)
    used = {replica["host"] for replica in view["replicas"]}
    free = next(h["id"] for h in fleet.api("GET", "/api/fleet/hosts") if h["id"] not in used)
    for _ in range(3):
        await cell("seen.append(len(seen))")
    migration = asyncio.ensure_future(
        asyncio.to_thread(fleet.api, "POST", f"{path}/replicas/{view['executor']}/migrate",
                          {"host": free})
    )  # fmt: skip
    during = 0
    while not migration.done() or during < 3:
        await cell("seen.append(len(seen))")
        during += 1
    await migration
    assert during >= 3
    assert executor_host(fleet, kernel_id) == free != first_host
    assert await cells_until_the_executor_leads() == free

    count = len(ran) - 1  # every cell but the first appended once
    assert await cell("print(seen == list(range(len(seen))), len(seen))") == f"True {count}\n"
    executors = await agreed_executors(fleet, live_replicas(fleet, kernel_id), ran)
    assert set(executors) == set(ran), "every cell has one executor, the same in every replica"
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def live_replicas(fleet, kernel_id):
    """A function that lists the replicas of `kernel_id` running at the time it is called."""

    def running():
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        return [r for r in replicas if r["state"] in ("ready", "executing")]

    return running


async def test_concurrent_cells_on_several_kernels_each_run_once_on_one_agreed_replica(replicated):
    fleet = replicated
    kernel_ids = [fleet.start_kernel() for _ in range(3)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernel_ids]

    async def run_cells(client, k):
        sent = [client.send("execute_request", {"code": f"v = {k * 10 + n}; print('k{k} c{n}')"})
                for n in range(5)]  # fmt: skip
        return sent, [await client.collect(msg_id) for msg_id in sent]

    runs = await asyncio.gather(*(run_cells(c, k) for k, c in enumerate(clients)))
    for k, (sent, results) in enumerate(runs):
        assert [r.stdout for r in results] == [f"k{k} c{n}\n" for n in range(5)], "once each"
        counts = [r.reply["execution_count"] for r in results]
        assert counts == list(range(counts[0], counts[0] + 5)), "one count per cell, in order"
        executors = await agreed_executors(fleet, live_replicas(fleet, kernel_ids[k]), set(sent))
        replicas = {
            r["id"] for r in fleet.api("GET", f"/api/fleet/kernels/{kernel_ids[k]}")["replicas"]
        }
        assert set(executors.values()) <= replicas

    # A duplicated request (same msg_id) is refused by the log, not run twice; it is answered
    # as the cell ended (ok, its effects kept), with a note that this is not a second run.
    client, kernel_id = clients[0], kernel_ids[0]
    code = "hits = globals().get('hits', 0) + 1; print(hits)"
    once = client.send("execute_request", {"code": code})
    first = await client.collect(once)
    assert first.stdout == "1\n"
    again = client.send("execute_request", {"code": code}, msg_id=once)
    duplicate = await client.collect(again)
    assert duplicate.reply["status"] == "ok"
    assert duplicate.reply["execution_count"] == first.reply["execution_count"]
    assert duplicate.stdout == ""
    notes = "".join(m["content"]["text"] for m in duplicate.of_type("stream"))
    assert notes.startswith("kernelfleet: this cell already ran, on this replica"), notes
    assert "not again" not in notes, "the replica's log line (kernel.log) reached the cell"
    assert (await client.execute("print(hits)")).stdout == "1\n"
    for client, kernel_id in zip(clients, kernel_ids, strict=True):
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_losing_the_raft_leader_between_cells_and_mid_cell_loses_no_committed_state(
    replicated,
):
    import os

    fleet = replicated
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    assert (await client.execute("import numpy as np\nlog = ['a']")).reply["status"] == "ok"

    async def raft_leader():
        # The executor takes the leadership after its cells: an election may be under way.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
            for replica in replicas:
                if (
                    replica["state"] == "ready"
                    and (await replica_status(fleet, replica))["raft"]["is_leader"]
                ):
                    return replica
            await asyncio.sleep(0.1)
        raise AssertionError(f"no Raft leader among {replicas}")

    def replaced(gone):
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        return gone["id"] not in {r["id"] for r in replicas} and all(
            r["state"] == "ready" for r in replicas
        )

    # Between cells.
    leader = await raft_leader()
    os.kill(leader["pid"], signal.SIGKILL)
    result = await client.execute("log.append('b'); print(log)", timeout=40)
    assert result.stdout == "['a', 'b']\n", result.iopub
    wait_for(lambda: replaced(leader), 40, "the lost leader to be replaced")

    # Mid-cell: the leader dies while a cell runs (on it, or on another replica).
    leader = await raft_leader()
    code = "import time\nprint('running', flush=True)\ntime.sleep(2)\nlog.append('c')"
    msg_id = client.send("execute_request", {"code": code})
    await client.wait_for_output(msg_id, "running")
    ran_on_leader = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"] == leader["id"]
    os.kill(leader["pid"], signal.SIGKILL)
    result = await client.collect(msg_id, timeout=40)
    expected = "['a', 'b']\n" if ran_on_leader else "['a', 'b', 'c']\n"
    if ran_on_leader:
        assert result.reply["ename"] == ErrorName.REPLICA_LOST
    else:
        assert result.reply["status"] == "ok", "a new leader commits the executor's delta"
    assert (await client.execute("print(log)", timeout=40)).stdout == expected
    wait_for(lambda: replaced(leader), 40, "the lost leader to be replaced")
    replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    assert len({await replica_digest(fleet, replica) for replica in replicas}) == 1
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_losing_the_executor_mid_cell_then_between_cells_loses_no_state(replicated):
    fleet = replicated
    first = fleet.start_kernel()
    view = fleet.api("GET", f"/api/fleet/kernels/{first}")
    assert len({replica["host"] for replica in view["replicas"]}) == 3, "3 distinct hosts"
    assert all(replica["state"] == "ready" for replica in view["replicas"])

    client = await fleet.connect(first)
    assert (await client.execute(STATE)).stdout == "state set\n"
    lost = executor_host(fleet, first)

    # Mid-cell: the executor's host dies while a cell runs.
    msg_id = client.send(
        "execute_request", {"code": "import time; print('long', flush=True); time.sleep(120)"}
    )
    await client.wait_for_output(msg_id, "long")
    started = time.monotonic()
    fleet.signal_host(lost, signal.SIGKILL)
    result = await client.collect(msg_id, timeout=30)
    heard = time.monotonic() - started
    assert result.reply["status"] == "error"
    assert result.reply["ename"] == ErrorName.REPLICA_LOST
    assert heard < 20, "the client hears of the loss within seconds"

    after = await client.execute(CHECK)
    recovered = time.monotonic() - started
    print(f"\nexecutor lost mid-cell: error after {heard:.1f} s, next cell done {recovered:.1f} s")
    assert after.stdout == EXPECTED, after.iopub
    assert executor_host(fleet, first) != lost

    # The lost replica is replaced on the one host the kernel did not use; it catches up.
    def replacement():
        replicas = fleet.api("GET", f"/api/fleet/kernels/{first}")["replicas"]
        fresh = [r for r in replicas if r["host"] not in view_hosts]
        return fresh and fresh[0]["state"] == "ready" and fresh[0]

    view_hosts = {replica["host"] for replica in view["replicas"]}
    new = wait_for(replacement, 30, "a replacement replica to catch up")
    print(f"replacement caught up {time.monotonic() - started:.1f} s after the loss")

    # Interrupt reaches the replica running the cell, not merely the first live one.
    msg_id = client.send(
        "execute_request", {"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"}
    )
    await client.wait_for_output(msg_id, "sleeping")
    fleet.api("POST", f"/api/kernels/{first}/interrupt", expect=204)
    assert (await client.collect(msg_id, timeout=20)).reply["ename"] == "KeyboardInterrupt"
    assert len(fleet.api("GET", f"/api/fleet/kernels/{first}")["replicas"]) == 3

    # Between cells: the executor is lost again; the next cell runs on the replacement.
    running_on = executor_host(fleet, first)
    lost_again = time.monotonic()
    fleet.signal_host(running_on, signal.SIGKILL)
    assert (await client.execute(CHECK, timeout=30)).stdout == EXPECTED
    print(f"executor lost between cells: next cell done {time.monotonic() - lost_again:.1f} s")
    assert executor_host(fleet, first) in {new["host"], *view_hosts} - {lost, running_on}
    client.close()
