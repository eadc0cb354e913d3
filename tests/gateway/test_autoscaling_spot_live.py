"""The gateway's autoscaler mixes host kinds live (docs/economics.md, "Transient hosts"): with
``autoscale_spot_share`` it adds spot hosts while they stay within the share of the fleet, and
kernels keep a majority of their replicas on on-demand hosts.

Three hand-started on-demand hosts of one GPU, kernels of 3 replicas. A demand model file that
predicts 5 busy GPUs (the trick of `test_autoscaling_demand_live`) makes the autoscaler add two
hosts before any cell: with a share of 0.4 both are spot (1 of 4, then 2 of 5). A kernel then
started has at most one replica on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelfleet.testing import wait_for

from .test_autoscaling_demand_live import model_file
from .test_autoscaling_live import hosts, replica_hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SCALING = (
    "--replicas", "3", "--autoscale", "--min-hosts", "3", "--max-hosts", "5",
    "--GatewayApp.autoscale_interval=0.3", "--GatewayApp.autoscale_patience=2",
    "--GatewayApp.autoscale_cooldown=0", "--GatewayApp.autoscale_buffer_hosts=0",
    "--GatewayApp.autoscale_headroom=1.0", "--GatewayApp.autoscale_gpus_per_host=1",
)  # fmt: skip


def predicting(path: Path, gpus: float) -> Path:
    model = model_file(path)
    document = json.loads(model.read_text(encoding="utf-8"))
    document["trees"][0]["value"] = [gpus]
    model.write_text(json.dumps(document), encoding="utf-8")
    return model


def test_hosts_added_are_spot_within_the_share_and_kernels_keep_a_majority_on_demand(
    private_fleet, tmp_path
):
    model = predicting(tmp_path / "model.json", 5.0)
    fleet = private_fleet(
        hosts=3,
        gpus=1,
        replicas=None,
        gateway_args=[
            *SCALING,
            f"--GatewayApp.autoscale_demand_model={model}",
            "--GatewayApp.autoscale_spot_share=0.4",
        ],
    )
    wait_for(lambda: {"auto-1", "auto-2"} <= set(hosts(fleet)), 60, "two hosts added")
    kinds = {host_id: host["kind"] for host_id, host in hosts(fleet).items()}
    assert kinds == {
        "host-1": "on-demand", "host-2": "on-demand", "host-3": "on-demand",
        "auto-1": "spot", "auto-2": "spot",
    }  # fmt: skip
    assert fleet.api("GET", "/api/fleet")["autoscaling"]["spot_share"] == 0.4
    for _ in range(3):
        kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
        on_spot = replica_hosts(fleet, kernel_id) & {"auto-1", "auto-2"}
        assert len(on_spot) <= 1, f"kernel {kernel_id} has {sorted(on_spot)} on spot hosts"


def test_a_spot_share_with_kernels_of_one_replica_is_not_used_and_says_why(private_fleet, tmp_path):
    fleet = private_fleet(
        hosts=1,
        gpus=1,
        replicas=1,
        gateway_args=["--autoscale", "--GatewayApp.autoscale_spot_share=0.5"],
    )
    why = "autoscale_spot_share 0.5 is not used: kernels of 1 replica(s) keep a majority"
    wait_for(lambda: why in fleet.log("gateway"), 30, "the warning in the gateway's log")
    assert fleet.api("GET", "/api/fleet")["autoscaling"]["spot_share"] == 0.0
