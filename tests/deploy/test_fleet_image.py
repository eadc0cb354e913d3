"""`kernelfleet image build --fleet`: the image deploy/compose.yaml runs holds what the gateway
and a host agent import (building it is tests/deploy/test_compose_up.py's work)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

from packaging.requirements import Requirement

from kernelfleet.kernels.agent.containers.images import KERNEL_REQUIREMENTS, fleet_requirements
from tests.kernels.conftest import REPO_ROOT


def test_the_fleet_image_holds_every_requirement_and_no_extra() -> None:
    names = fleet_requirements()
    assert len(names) == len(set(names))
    assert set(KERNEL_REQUIREMENTS) <= set(names)  # agents run kernels beside them
    for line in importlib.metadata.requires("kernelfleet") or []:
        requirement = Requirement(line)
        extra = requirement.marker is not None and "extra" in str(requirement.marker)
        assert (requirement.name in names) != extra, line
    assert {"jupyter-server", "docker", "prometheus-client", "cvxpy"} <= set(names)
    assert not {"pytest", "torch", "optuna"} & set(names)


def test_a_fleet_image_has_no_kernelspec() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelfleet",
            "image",
            "build",
            "--fleet",
            "--base=b",
            "--tag=t",
            "--kernelspec=k",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--fleet builds the gateway's and agents' image: no --kernelspec" in done.stderr
