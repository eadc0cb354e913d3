"""A lost replica is replaced on any live host that holds no other replica of its kernel.

On a fleet of exactly as many hosts as replicas (the fleet ``kernelfleet up`` starts), a replica
whose process dies on a host that stays alive must come back on that same host: before, the
repair excluded every host the kernel had used, found none, said "no host agent is alive" (all
were) and never tried again, leaving the kernel one loss away from death.
"""

from __future__ import annotations

import os
import signal

import pytest

from kernelfleet.testing import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def replicas(fleet, kernel_id: str) -> list[dict]:
    return fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]


async def test_the_executors_replica_killed_on_a_full_fleet_is_replaced_on_its_own_host(
    fleet_factory,
):
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("x = 41")).reply["status"] == "ok"
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        (executor,) = [r for r in model["replicas"] if r["id"] == model["executor"]]

        os.kill(executor["pid"], signal.SIGKILL)

        def replaced() -> list[dict] | None:
            now = replicas(fleet, kernel_id)
            ready = [r for r in now if r["state"] in ("ready", "executing")]
            fresh = executor["id"] not in {r["id"] for r in now}
            return now if fresh and len(ready) == 3 else None

        now = wait_for(replaced, 30, "a ready replacement of the killed replica")
        assert sorted(r["host"] for r in now) == ["host-1", "host-2", "host-3"]
        wait_for(
            lambda: fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["degraded"] is None,
            10,
            "the kernel to say it is whole again",
        )
        assert (await client.execute("print(x + 1)", timeout=60)).stdout == "42\n"
        events = fleet.api("GET", f"/api/fleet/events?kernel={kernel_id}&n=1000")
        kinds = [e["type"] for e in events]
        assert kinds.index("replica-lost") < kinds.index("replica-replaced")
        (done,) = [e for e in events if e["type"] == "replica-replaced"]
        assert (done["data"]["from_host"], done["data"]["to_host"]) == (executor["host"],) * 2
        said = next(e["data"] for e in events if e["type"] == "kernel-degraded")
        assert said["reason"] == (
            f"replica {executor['id']} on {executor['host']} died (its process exited (-9)); "
            "it is being replaced"
        )
        assert (said["live_replicas"], said["wanted_replicas"]) == (2, 3)
        assert kinds.index("kernel-degraded") < kinds.index("replica-replaced")
        assert kinds.index("replica-replaced") < kinds.index("kernel-repaired")
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert "no host agent is alive" not in fleet.log()


async def test_with_every_host_holding_a_replica_the_repair_waits_and_says_why(fleet_factory):
    """A host lost for good leaves no free host: the kernel runs on, the log says the true
    cause once, and a host added later gets the replacement."""
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3)
    kernel_id = fleet.start_kernel()
    try:
        fleet.signal_host("host-3", signal.SIGKILL)
        wait_for(lambda: fleet.host_state("host-3") == "lost", 30, "host-3 to be lost")
        said = "every live host holds a replica of kernel"
        wait_for(lambda: said in fleet.log(), 30, "the repair to say why it waits")
        degraded = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["degraded"]
        assert said in degraded["reason"], "the model says why too"
        assert fleet.log().count(said) == 1, "said once, not at every try"
        assert "no host agent is alive" not in fleet.log()

        fleet.start_host("host-4", 1)

        def replaced() -> list[dict] | None:
            now = replicas(fleet, kernel_id)
            return now if "host-4" in {r["host"] for r in now if r["state"] == "ready"} else None

        wait_for(replaced, 60, "the replacement on the new host-4")
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
