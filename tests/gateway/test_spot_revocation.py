"""A spot host revoked as a cloud revokes one (its agent and every process under it killed at
once, no notice honoured) costs a replica, never a kernel nor its state (issue 17 item 4,
docs/economics.md, "Transient hosts").

The fleet: 2 on-demand hosts and a spot one, so a kernel of 3 replicas has exactly one replica on
spot: the majority stays on on-demand hosts. After the revocation the kernel runs on with its
state, and the lost replica is replaced on the spot host that comes in its place.
"""

from __future__ import annotations

import signal

import pytest

from kernelfleet.testing import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def replicas(fleet, kernel_id: str) -> list[dict]:
    return fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]


async def test_a_revoked_spot_host_costs_a_replica_never_the_kernel_or_its_state(fleet_factory):
    fleet = fleet_factory(hosts=2, gpus=1, replicas=3)
    fleet.start_host("host-3", 1, "--kind", "spot")
    kinds = {h["id"]: h["kind"] for h in fleet.api("GET", "/api/fleet/hosts")}
    assert kinds == {"host-1": "on-demand", "host-2": "on-demand", "host-3": "spot"}
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert sorted(r["host"] for r in replicas(fleet, kernel_id)) == [
            "host-1",
            "host-2",
            "host-3",
        ]
        assert (await client.execute("state = {'epoch': 41}")).reply["status"] == "ok"

        fleet.signal_host("host-3", signal.SIGKILL)  # the agent and its kernels, at once
        wait_for(lambda: fleet.host_state("host-3") == "lost", 30, "host-3 to be lost")

        # the kernel runs on its on-demand majority, state and all, while it is short
        reply = await client.execute("state['epoch'] += 1; print(state)", timeout=60)
        assert reply.stdout == "{'epoch': 42}\n"

        fleet.start_host("host-4", 1, "--kind", "spot")  # the provider's next spot machine

        def replaced() -> list[dict] | None:
            now = replicas(fleet, kernel_id)
            ready = sorted(r["host"] for r in now if r["state"] in ("ready", "executing"))
            return now if ready == ["host-1", "host-2", "host-4"] else None

        wait_for(replaced, 60, "the lost replica replaced on the new spot host")
        reply = await client.execute("print(state['epoch'] + 1)", timeout=60)
        assert reply.stdout == "43\n"
        kinds = [
            e["type"] for e in fleet.api("GET", f"/api/fleet/events?kernel={kernel_id}&n=1000")
        ]
        assert "replica-lost" in kinds
        assert "replica-replaced" in kinds
        assert kinds.index("replica-lost") < kinds.index("kernel-repaired")
        assert "kernel-stopped" not in kinds
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_two_replicas_of_three_never_go_on_spot_hosts(fleet_factory):
    """Placing 2 of 3 replicas on spot would let one revocation with a replacement under way
    lose the kernel: with 1 on-demand host and 2 spot ones (and no autoscaler to add more) a
    kernel is refused, saying why, and once a second on-demand host is up it starts with a
    single replica on spot."""
    fleet = fleet_factory(hosts=1, gpus=1, replicas=3)
    fleet.start_host("host-2", 1, "--kind", "spot")
    fleet.start_host("host-3", 1, "--kind", "spot")
    status, body = fleet.request("POST", "/api/kernels", {"name": "python3", "env": {}})
    assert status == 503, body
    assert "at most 1 of its replicas may be on spot hosts" in body["message"], body
    assert "1 large enough host(s) are on-demand" in body["message"], body
    fleet.start_host("host-4", 1)
    kernel_id = fleet.start_kernel()
    try:
        hosts = sorted(r["host"] for r in replicas(fleet, kernel_id))
        assert "host-1" in hosts
        assert "host-4" in hosts
        assert len([h for h in hosts if h in ("host-2", "host-3")]) == 1
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
