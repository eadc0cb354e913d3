"""A replica cut off from its Raft group by a real network partition (Linux network namespaces).

The ``partitioned`` fixture (conftest.py) runs a gateway in the root namespace and one host
agent in each of 3 namespaces (`kernelfleet.testing.netns`: a control bridge for the gateway's
HTTP, heartbeats and ZMQ, a Raft bridge for the replicas' pysyncobj ports); the test cuts the
executor's host's port on the Raft bridge only (``ip link set kr<i>-<sfx> down``, as if its
cable were pulled at the switch), so its heartbeats and channels go on, then heals it. (Downing
``raft0`` inside the namespace instead works too; the healed replica then takes a couple of
seconds longer to reconnect.)
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kernelfleet.protocol import ErrorName
from kernelfleet.testing import Fleet, wait_for
from kernelfleet.testing.replicas import (
    agreed_executors,
    execute_on,
    replica_digest,
    replica_status,
)

pytestmark = pytest.mark.timeout(180)  # about 17 s on 2 cores: not marked slow

HOSTS = 3


def _assert_every_host_alive(fleet: Fleet) -> None:
    """The cut is Raft-only: the gateway still hears every host and keeps every replica."""
    states = {h["id"]: h["state"] for h in fleet.api("GET", "/api/fleet/hosts")}
    assert states == {f"host-{i}": "alive" for i in range(1, HOSTS + 1)}, states


# ---- the test ---------------------------------------------------------------------------------


async def test_a_replica_cut_off_from_raft_cannot_execute_the_majority_goes_on_and_it_catches_up(
    partitioned,
):
    fleet, topology = partitioned.fleet, partitioned.topology
    kernel_id = fleet.start_kernel()
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    replicas = view["replicas"]
    assert sorted(r["host"] for r in replicas) == ["host-1", "host-2", "host-3"]
    client = await fleet.connect(kernel_id)
    for code in ("import numpy as np", "x = 1\nitems = ['a']", "def twice(v):\n    return 2 * v"):
        assert (await client.execute(code)).reply["status"] == "ok", code
    for replica in replicas:  # Raft really runs over the Raft bridge
        address = (await replica_status(fleet, replica))["raft"]["address"]
        assert address.startswith(topology.raft_ip(int(replica["host"].split("-")[1])) + ":")

    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    isolated = next(r for r in replicas if r["id"] == view["executor"])
    majority = [r for r in replicas if r["id"] != isolated["id"]]
    index = int(isolated["host"].split("-")[1])
    was_leader = (await replica_status(fleet, isolated))["raft"]["is_leader"]

    # Cut the executor's Raft link; its cell is refused (it cannot commit its LEAD) and the
    # gateway sends it to a replica of the majority side, which runs it.
    topology.cut(index)
    cut_at = time.monotonic()
    try:
        code = "import time\ntime.sleep(1)\nx += 1\nitems.append('cut')\nprint(x, items)"
        during = client.send("execute_request", {"code": code})

        def sent_elsewhere():
            now = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
            running = {r["id"] for r in now["replicas"] if r["state"] == "executing"}
            return running & {r["id"] for r in majority} or now["executor"] != isolated["id"]

        wait_for(sent_elsewhere, 30, "the isolated executor to refuse and the cell to move")
        refused_at = time.monotonic()
        result = await client.collect(during, timeout=60)
        done_at = time.monotonic()
        assert result.reply["status"] == "ok", result.reply
        assert result.stdout == "2 ['a', 'cut']\n"
        ran_on = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"]
        assert ran_on in {r["id"] for r in majority}, (ran_on, isolated["id"])

        # The majority goes on, a value through the object store included.
        code = "x += 1\nbig = np.arange(300_000)\nprint(x, twice(x), int(big.sum()))"
        after = client.send("execute_request", {"code": code})
        second = await client.collect(after, timeout=60)
        assert second.reply["status"] == "ok", second.reply
        assert second.stdout == f"3 6 {sum(range(300_000))}\n"
        cells = {during, after}
        agreed = await agreed_executors(fleet, lambda: majority, cells, timeout=20)
        assert isolated["id"] not in agreed.values(), agreed

        # Asked directly, the isolated replica refuses: it cannot commit its LEAD.
        asked_at = time.monotonic()
        content, output = await execute_on(fleet, isolated, "x = -1\nprint('ran')", timeout=60)
        refusal = time.monotonic() - asked_at
        assert content["status"] == "error", content
        assert content["ename"] == ErrorName.REPLICA_ISOLATED, content
        assert output == ""
        behind = await replica_status(fleet, isolated)
        ahead = [await replica_status(fleet, r) for r in majority]
        assert not behind["raft"]["is_leader"], behind["raft"]
        target = max(status["raft"]["applied"] for status in ahead)
        assert behind["raft"]["applied"] < target, (behind["raft"], [a["raft"] for a in ahead])
        assert any(status["raft"]["is_leader"] for status in ahead), "the majority has a leader"

        # Heartbeats went on over the control link all along: nobody was declared lost or
        # replaced, however long the cut lasted (the gateway's heartbeat timeout is 5 s).
        cut_for = time.monotonic() - cut_at
        assert cut_for > 5
        _assert_every_host_alive(fleet)
        now = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        assert {r["id"] for r in now} == {r["id"] for r in replicas}, now
    finally:
        topology.heal(index)
    healed_at = time.monotonic()

    # Healed, it catches up: its log reaches the majority's, then every namespace is equal.
    async def caught_up() -> bool:
        return (await replica_status(fleet, isolated))["raft"]["applied"] >= target

    deadline = time.monotonic() + 30
    while not await caught_up():
        assert time.monotonic() < deadline, "the healed replica did not catch up in 30 s"
        await asyncio.sleep(0.1)
    caught_up_in = time.monotonic() - healed_at
    digests = {r["id"]: await replica_digest(fleet, r) for r in [isolated, *majority]}
    assert len(set(digests.values())) == 1, digests
    agreed_by_all = await agreed_executors(fleet, lambda: replicas, cells, timeout=20)
    assert agreed_by_all == agreed, "the healed replica learned who ran the cells of the cut"
    final = await client.execute("print(x, items, int(big.sum()))", timeout=30)
    assert final.stdout == f"3 ['a', 'cut'] {sum(range(300_000))}\n", final.reply
    _assert_every_host_alive(fleet)

    print(
        f"\npartition: executor {isolated['id']} on {isolated['host']}"
        f" ({'' if was_leader else 'not '}the Raft leader) cut off;"
        f" refused and sent elsewhere {refused_at - cut_at:.1f} s after the cut,"
        f" cell done {done_at - refused_at:.1f} s later ({done_at - cut_at:.1f} s in all);"
        f" a direct request refused with {ErrorName.REPLICA_ISOLATED} after {refusal:.1f} s;"
        f" cut lasted {cut_for:.1f} s with every host alive;"
        f" caught up {caught_up_in:.2f} s after the heal"
        f" (applied {behind['raft']['applied']} -> {target})"
    )
    client.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
