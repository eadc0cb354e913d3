"""An operator's drain (``POST /api/fleet/hosts/{id}/drain``, docs/deploy and docs/economics):
the host takes no new work at once, its replicas move away with their kernels' state, and
``DELETE`` opens it again. Refusals change nothing and say why."""

from __future__ import annotations

import pytest

from kernelfleet.testing import wait_for

from .test_autoscaling_live import replica_hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def host(fleet, host_id: str) -> dict:
    return fleet.api("GET", f"/api/fleet/hosts/{host_id}")


async def test_a_drained_host_loses_its_replicas_kernels_keep_their_state_and_it_reopens(
    private_fleet,
):
    fleet = private_fleet(hosts=4, gpus=1, replicas=3)
    kernels = [fleet.start_kernel() for _ in range(2)]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    for n, client in enumerate(clients):
        assert (await client.execute(f"kept = {n} * 10")).reply["status"] == "ok"
    busy = max(["host-1", "host-2", "host-3", "host-4"], key=lambda h: sum(
        h in replica_hosts(fleet, k) for k in kernels
    ))  # fmt: skip
    assert host(fleet, busy)["drain"] is None
    on_it = sum(busy in replica_hosts(fleet, k) for k in kernels)

    answer = fleet.api("POST", f"/api/fleet/hosts/{busy}/drain", {"why": "a new driver"}, 202)
    assert answer["drain"]["why"] == "a new driver"
    assert answer["drain"]["state"] in ("moving", "drained")
    wait_for(lambda: host(fleet, busy)["drain"]["state"] == "drained", 90, "the drain to end")
    drained = host(fleet, busy)["drain"]
    assert drained["left"] == 0
    assert drained["replicas"] == on_it
    for n, (kernel_id, client) in enumerate(zip(kernels, clients, strict=True)):
        assert busy not in replica_hosts(fleet, kernel_id)
        assert len(replica_hosts(fleet, kernel_id)) == 3
        assert (await client.execute("print(kept)")).stdout == f"{n * 10}\n"
    newcomer = fleet.start_kernel()
    assert busy not in replica_hosts(fleet, newcomer), "a drained host takes no new replica"

    reopened = fleet.api("DELETE", f"/api/fleet/hosts/{busy}/drain")
    assert reopened["drain"] is None
    status, refused = fleet.request("DELETE", f"/api/fleet/hosts/{busy}/drain")
    assert (status, refused["reason"]) == (409, "conflict"), refused
    assert "not draining" in refused["message"]
    for client in clients:
        client.close()


def test_what_cannot_be_drained_is_refused_before_anything_moves(private_fleet):
    fleet = private_fleet(hosts=2, gpus=1, replicas=1)
    kernel_id = fleet.start_kernel()
    (where,) = replica_hosts(fleet, kernel_id)
    status, refused = fleet.request("POST", f"/api/fleet/hosts/{where}/drain")
    assert status == 409, refused
    assert f"runs single-replica kernel(s) {kernel_id}" in refused["message"]
    assert host(fleet, where)["drain"] is None
    assert fleet.request("POST", "/api/fleet/hosts/host-9/drain")[0] == 404
    status, refused = fleet.request("POST", f"/api/fleet/hosts/{where}/drain", {"why": ""})
    assert status == 400, refused
    assert "'why' must be a non-empty string" in refused["message"]
