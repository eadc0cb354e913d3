"""A replacement that cannot join its kernel's Raft group leaves the group again.

Left in, a replacement that never answered would count as a member: the two live replicas of
a 3-replica kernel would hold 2 of 3 votes, and one more such failure (2 of 4) would leave the
kernel unable to commit anything (the chaos soak lost kernels that way). Here the replacement's
host has its Raft cable pulled, so its join times out for real; once the cable is back, the
repair, tried again, succeeds.
"""

from __future__ import annotations

import os
import signal

import pytest

from kernelfleet.testing import wait_for
from kernelfleet.testing.replicas import replica_status

pytestmark = pytest.mark.timeout(240)


async def test_a_replacement_that_cannot_join_is_taken_out_of_the_group(partitioned):
    fleet, topology = partitioned.fleet, partitioned.topology
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("x = 41")).reply["status"] == "ok"
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        lost = next(r for r in replicas if r["host"] == "host-3")
        live = [r for r in replicas if r is not lost]

        topology.cut(3)  # the only host a replacement may go to cannot reach the group
        os.kill(lost["pid"], signal.SIGKILL)
        wait_for(
            lambda: f"replacing {lost['id']} failed" in fleet.log(),
            90,
            "the replacement's join to time out",
        )
        for replica in live:
            members = (await replica_status(fleet, replica))["raft"]["members"]
            assert len(members) == 2, (replica["id"], members)

        topology.heal(3)

        def whole() -> bool:
            model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
            ready = [r for r in model["replicas"] if r["state"] in ("ready", "executing")]
            return len(ready) == 3 and model["degraded"] is None

        wait_for(whole, 120, "the repair to succeed once the cable is back")
        for replica in live:
            members = (await replica_status(fleet, replica))["raft"]["members"]
            assert len(members) == 3, (replica["id"], members)
        assert (await client.execute("print(x + 1)", timeout=60)).stdout == "42\n"
    finally:
        client.close()
