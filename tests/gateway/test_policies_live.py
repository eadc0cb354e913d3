"""The gateway driven by a policy other than notebookos: `reservation`, the JupyterHub/Colab way,
holds a kernel's GPUs from its start to its end; `fcfs-batch` is refused (simulator only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernelfleet.protocol import gpu_request
from kernelfleet.testing import TOKEN, Fleet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SHOW_GPUS = "import os\nprint('gpus', os.environ['KERNELFLEET_GPUS'])"


@pytest.fixture
def reservation_fleet(private_fleet):
    gateway_args = ["--policy", "reservation", "--GatewayApp.check_ledger=True"]
    return private_fleet(hosts=2, gpus=1, replicas=None, gateway_args=gateway_args)


def committed(fleet: Fleet) -> dict[str, int]:
    return {h["id"]: h["gpus"]["committed"] for h in fleet.api("GET", "/api/fleet/hosts")}


async def test_reservation_holds_gpus_for_the_kernels_whole_life(reservation_fleet):
    fleet = reservation_fleet
    assert fleet.api("GET", "/api/fleet")["policy"] == "reservation"
    first = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    assert len(fleet.api("GET", f"/api/fleet/kernels/{first}")["replicas"]) == 1
    assert sum(committed(fleet).values()) == 1, "committed at start, before any cell"

    client = await fleet.connect(first)
    for _ in range(2):
        result = await client.execute(SHOW_GPUS)
        assert result.reply["status"] == "ok"
        assert result.stdout.strip() == "gpus 0"
        assert sum(committed(fleet).values()) == 1, "still held between cells"
    other = await client.execute("print(1)", metadata=gpu_request(2))
    assert other.reply["status"] == "error"
    assert "held for its whole life" in other.reply["evalue"]

    second = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    assert committed(fleet) == {"host-1": 1, "host-2": 1}
    status, refused = fleet.request(
        "POST", "/api/kernels", {"name": "python3", "env": {"KERNEL_GPUS": "1"}}
    )
    assert status == 503, refused
    assert refused["reason"] == "no-capacity"

    client.close()
    fleet.api("DELETE", f"/api/kernels/{first}", expect=204)
    # DELETE answers before the replicas have stopped; their GPUs come back once they have
    wait_for(lambda: sum(committed(fleet).values()) == 1, 30, "a kernel's end gives its GPUs back")
    third = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    assert sum(committed(fleet).values()) == 2
    for kernel_id in (second, third):
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    wait_for(lambda: sum(committed(fleet).values()) == 0, 30, "both kernels' GPUs back")
    metrics = fleet.request_text("GET", "/metrics")
    assert "kernelfleet_ledger_breaches_total 0" in metrics


def test_the_gateway_refuses_a_policy_it_cannot_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "gateway", "--policy", "fcfs-batch", "--port", "0",
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KERNELFLEET_TOKEN": TOKEN},
    )  # fmt: skip
    assert result.returncode == 2
    assert "only `kernelfleet simulate` does" in result.stderr
