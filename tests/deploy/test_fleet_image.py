"""`kernelfleet image build --fleet`: the image deploy/compose.yaml runs holds what the gateway
and a host agent import (building it is tests/deploy/test_compose_up.py's work)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from kernelfleet.kernels.agent.containers.images import (
    KERNEL_REQUIREMENTS,
    _installs_on,
    fleet_requirements,
)
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


def test_a_wheel_is_kept_only_for_a_python_it_installs_on(tmp_path: Path) -> None:
    """What made the fleet image fail on Debian 12's Python 3.11.2: soupsieve 4.1.3, which
    pip picked on 3.11.7, needs 3.11.5."""
    wheel = tmp_path / "soupsieve-4.1.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "soupsieve-4.1.3.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: soupsieve\nVersion: 4.1.3\nRequires-Python: >=3.11.5\n",
        )
    assert not _installs_on(wheel, "3.11.2")
    assert _installs_on(wheel, "3.11.5")
    anything = tmp_path / "six-1.17.0-py2.py3-none-any.whl"
    with zipfile.ZipFile(anything, "w") as archive:
        archive.writestr("six-1.17.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: six\n")
    assert _installs_on(anything, "3.11.2")
