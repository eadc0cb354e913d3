"""A replacement replica of a kernel that ran many cells catches up from a pruned snapshot
(real gateway, host agents and ReplicatedKernel processes, small compaction limits)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from kernelfleet.testing import wait_for
from kernelfleet.testing.replicas import execute_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CELLS = 90
SMALL_LOG = {
    "KERNELFLEET_RAFT_PRUNE_MIN_ENTRIES": "40",
    "KERNELFLEET_RAFT_KEEP_RECENT_ENTRIES": "6",
    "KERNELFLEET_RAFT_COMPACTION_MIN_ENTRIES": "50",
}
CELL = "x = {n}\nbig = np.full(20_000, {n}.0)  # 160 kB: through the object store\n"
REPORT = """
import json
raft = get_ipython().kernel.group.raft
print(json.dumps({
    "delivered": raft.delivered_count, "applied": raft.applied_count,
    "x": x, "big": float(big[0]), "names": sorted(n for n in dir() if n.startswith("v")),
}))
"""


def replicas(fleet, kernel_id: str) -> list[dict]:
    return fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]


async def test_a_replacement_gets_a_snapshot_and_the_same_variables(fleet_factory):
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3, env=SMALL_LOG)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("import numpy as np")).reply["status"] == "ok"
        for n in range(CELLS):
            code = CELL.format(n=n) + (f"v{n} = {n}\n" if n % 10 == 0 else "")
            assert (await client.execute(code, timeout=60)).reply["status"] == "ok"
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        lost = next(r for r in model["replicas"] if r["id"] != model["executor"])
        os.kill(lost["pid"], signal.SIGKILL)

        def replacement() -> dict | None:
            now = replicas(fleet, kernel_id)
            ready = [r for r in now if r["state"] in ("ready", "executing")]
            if lost["id"] in {r["id"] for r in now} or len(ready) < 3:
                return None
            fresh = [r for r in ready if r["id"] not in {o["id"] for o in model["replicas"]}]
            return fresh[0] if fresh else None

        fresh = wait_for(replacement, 60, "a ready replacement")
        content, output = await execute_on(fleet, fresh, REPORT, timeout=60)
        assert content["status"] == "ok", content
        seen = json.loads(output)
        assert seen["x"] == CELLS - 1
        assert seen["big"] == CELLS - 1
        assert seen["names"] == [f"v{n}" for n in range(0, CELLS, 10)]
        # every cell wrote at least two entries (its LEAD and its delta); the replacement
        # got the few that still set something, and what came after the last dump
        assert seen["applied"] >= 2 * CELLS
        assert seen["delivered"] < seen["applied"] / 2, seen
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
