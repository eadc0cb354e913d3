"""Per-GPU fingerprints through the live gateway: every GPU's fingerprint is in
``GET /api/fleet/hosts``, and a ``%%gpus 1`` cell runs on the fastest free GPU.

Two hosts of two virtual GPUs with configured speeds (``--gpu-speed``): host-1's are slow
(0.5, 0.6), host-2's are one slow and one fast (0.5, 1.2); the kernel has a replica on each.
Both hosts are otherwise equal, so the policy takes host-2 (faster free GPUs) and the ledger its
device 1 (the faster one, though device 0 comes first in the host's order)."""

from __future__ import annotations

import pytest

from kernelfleet.kernels.agent.fingerprint import configured

pytestmark = pytest.mark.slow  # a fleet of its own: about 10 s

CELL = "%%gpus 1\nimport os\nprint('gpus', os.environ['KERNELFLEET_GPUS'], flush=True)"


async def test_fingerprints_are_shown_and_a_cell_gets_the_fastest_gpu(private_fleet):
    fleet = private_fleet(hosts=2, gpus=2, replicas=2, gpu_speeds=["0.5,0.6", "0.5,1.2"])
    hosts = {host["id"]: host for host in fleet.api("GET", "/api/fleet/hosts")}
    for host_id, speeds in (("host-1", (0.5, 0.6)), ("host-2", (0.5, 1.2))):
        devices = hosts[host_id]["gpus"]["devices"]
        assert [device["id"] for device in devices] == ["0", "1"]
        assert [device["fingerprint"] for device in devices] == [
            configured(speed).to_dict() for speed in speeds
        ]
        assert [device["relative_speed"] for device in devices] == list(speeds)

    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        result = await client.collect(client.send("execute_request", {"code": CELL}), timeout=60)
        assert result.reply["status"] == "ok", result.reply
        assert result.stdout.splitlines()[0] == "gpus 1", result.stdout
        cell = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["recent_cells"][-1]
        assert (cell["host"], cell["devices"]) == ("host-2", ["1"])
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
