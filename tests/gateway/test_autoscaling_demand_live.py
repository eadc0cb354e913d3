"""The gateway's autoscaler follows a demand model file live (docs/economics.md), and falls back
to the reactive rule, with a warning naming why, on a file it cannot use.

The model is a real file in the format `kernelfleet demand train` writes, with one tree of one
leaf: whatever the features, busy GPUs will rise by 3 within its horizon. With two hand-started
hosts of one GPU and no kernel at all, the autoscaler adds a third host for the predicted GPUs,
before any cell asks for one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelfleet.scheduler.demand import FEATURES
from kernelfleet.testing import wait_for

from .test_autoscaling_live import autoscaling_fleet, hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def model_file(path: Path, gpus_per_host: int = 1) -> Path:
    document = {
        "format": "kernelfleet-demand-forest",
        "version": 1,
        "features": list(FEATURES),
        "step_s": 1.0,
        "window_steps": 1,
        "horizon_s": 1.0,
        "gpus_per_host": gpus_per_host,
        "quantile": 0.9,
        "margin_gpus": 0.0,
        "trained": {"trace": "by hand", "from_s": 0, "until_s": 60, "steps": 60},
        "quality": {},
        "trees": [
            {"left": [-1], "right": [-1], "feature": [-2], "threshold": [-2.0], "value": [3.0]}
        ],
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_the_autoscaler_adds_a_host_for_the_predicted_demand(private_fleet, tmp_path):
    model = model_file(tmp_path / "model.json")
    fleet = autoscaling_fleet(private_fleet, f"--GatewayApp.autoscale_demand_model={model}")
    wait_for(lambda: "auto-1" in hosts(fleet), 60, "a host added for the predicted demand")
    autoscaling = fleet.api("GET", "/api/fleet")["autoscaling"]
    assert autoscaling["demand_model"]["file"] == str(model)
    assert autoscaling["demand_model"]["predicted_gpus"] == 3.0
    assert autoscaling["hosts_started"] == ["auto-1"]
    assert fleet.api("GET", "/api/kernels") == []  # no cell asked for anything
    assert "demand model " + str(model) in fleet.log("gateway")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (lambda path: path.write_text('{"format": "kernelfleet-demand-fo', encoding="utf-8"),
         "not a JSON demand model"),
        (lambda path: model_file(path, gpus_per_host=8),
         "trained for hosts of 8 GPU(s) (gpus_per_host), this fleet adds hosts of 1"),
    ],
)  # fmt: skip
def test_a_model_it_cannot_use_leaves_the_reactive_rule_with_a_warning(
    private_fleet, tmp_path, content, why
):
    model = tmp_path / "model.json"
    content(model)
    fleet = autoscaling_fleet(private_fleet, f"--GatewayApp.autoscale_demand_model={model}")
    warning = "demand model not used, autoscaling follows the reactive rule"
    wait_for(lambda: warning in fleet.log("gateway"), 30, "the warning in the gateway's log")
    assert why in fleet.log("gateway")
    assert fleet.api("GET", "/api/fleet")["autoscaling"]["demand_model"] is None
