"""A host killed outright is lost at once, and its kernels say they are degraded, and why.

On the 3-host fleet ``kernelfleet up`` starts, a kernel of 3 replicas that loses a host has no
host for a replacement: it runs on 2, its models, events, metrics and ``%fleet`` say so with
the true cause, and the repair tries again the moment the host comes back (not at its next
timer tick), after which the kernel is whole and says so.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from kernelfleet.kernels.magics.views import kernel_view
from kernelfleet.testing import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def events(fleet, kernel_id: str | None = None) -> list[dict]:
    query = f"kernel={kernel_id}&" if kernel_id else ""
    return fleet.api("GET", f"/api/fleet/events?{query}n=1000")


def degraded_gauge(fleet) -> float:
    (line,) = [
        line
        for line in fleet.request_text("GET", "/metrics").splitlines()
        if line.startswith("kernelfleet_kernels_degraded ")
    ]
    return float(line.split()[1])


async def test_a_killed_host_is_lost_at_once_and_its_kernel_is_degraded_until_repaired(
    fleet_factory,
):
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("n = 1")).reply["status"] == "ok"
        assert fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["degraded"] is None
        assert fleet.api("GET", f"/api/kernels/{kernel_id}")["degraded"] is None
        doomed = next(
            r for r in fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
            if r["host"] == "host-3"
        )  # fmt: skip

        fleet.signal_host("host-3", signal.SIGKILL)

        wait_for(lambda: fleet.host_state("host-3") == "lost", 30, "host-3 to be lost")
        (lost,) = [e for e in events(fleet) if e["type"] == "host-lost"]
        assert "connection to the gateway closed" in lost["data"]["why"], (
            "seen by its broken link, not after the heartbeat timeout"
        )

        def waiting() -> dict | None:
            degraded = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["degraded"]
            return degraded if degraded and "a replacement waits" in degraded["reason"] else None

        degraded = wait_for(waiting, 30, "the kernel to say its replacement waits")
        assert (degraded["live_replicas"], degraded["wanted_replicas"]) == (2, 3)
        assert degraded["reason"].startswith(
            f"replica {doomed['id']} on host-3 died (host host-3 was lost: its agent's "
            "connection to the gateway closed"
        )
        assert "every live host holds a replica of kernel" in degraded["reason"]
        assert 0 < time.time() - degraded["since"] < 60
        assert fleet.api("GET", f"/api/kernels/{kernel_id}")["degraded"] == degraded
        shown = repr(kernel_view(fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")))
        assert f"degraded: 2 of 3 replicas - replica {doomed['id']} on host-3 died" in shown
        assert degraded_gauge(fleet) == 1
        said = [e["data"] for e in events(fleet, kernel_id) if e["type"] == "kernel-degraded"]
        assert said[-1] == {k: degraded[k] for k in ("reason", "live_replicas", "wanted_replicas")}
        assert (await client.execute("print(n)")).stdout == "1\n", "it runs on meanwhile"

        await asyncio.sleep(8)  # the repair's timer has backed off: its next try is seconds away
        fleet.start_host("host-3", 1)
        wait_for(
            lambda: "a host registered or came back: trying again" in fleet.log(),
            10,
            "the repair to try again at once",
        )

        def whole() -> bool:
            model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
            return model["degraded"] is None

        wait_for(whole, 60, "the kernel to be whole again")
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        assert sorted(r["host"] for r in replicas) == ["host-1", "host-2", "host-3"]
        assert all(r["state"] in ("ready", "executing") for r in replicas)
        kinds = [e["type"] for e in events(fleet, kernel_id)]
        assert kinds.index("kernel-degraded") < kinds.index("replica-replaced")
        assert kinds[-1] == "kernel-repaired" or "kernel-repaired" in kinds
        assert kinds.index("replica-replaced") < kinds.index("kernel-repaired")
        assert degraded_gauge(fleet) == 0
        assert "degraded" not in repr(
            kernel_view(fleet.api("GET", f"/api/fleet/kernels/{kernel_id}"))
        )
        assert (await client.execute("print(n + 1)")).stdout == "2\n"
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
