"""docs/deploy.md's operator commands, run as written against a real fleet of local processes
(the guide runs them in the gateway's container or on the operator's machine; only the
gateway's URL differs): reading the hosts with the token's header file, and draining a host."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelfleet.testing import Fleet, wait_for
from tests.kernels.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GUIDE = (REPO_ROOT / "docs" / "deploy.md").read_text()
GUIDE_URL = "http://127.0.0.1:8765"


def guide_block(first_line: str) -> str:
    """The guide's ```bash block that starts with `first_line`."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE, re.DOTALL)
    found = [b for b in blocks if b.startswith(first_line)]
    assert len(found) == 1, f"docs/deploy.md has {len(found)} blocks starting {first_line!r}"
    return found[0]


def test_the_hosts_are_read_with_the_token_kept_off_the_command_line(
    private_fleet: Callable[..., Fleet], tmp_path: Path
) -> None:
    fleet = private_fleet(hosts=1, gpus=1, gateway_args=("--kernel-pool-size", "0"))
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "fleet.env").write_text(
        f"# a comment\nKERNELFLEET_TOKEN={fleet.token}\n"
    )
    script = guide_block("sed -n 's/^KERNELFLEET_TOKEN=/Authorization: token /p'")
    assert fleet.token not in script
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace(GUIDE_URL, fleet.url)],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"id": "host-1"' in done.stdout.replace('"id":"host-1"', '"id": "host-1"')


def test_draining_a_host_moves_its_replicas_off_it(
    private_fleet: Callable[..., Fleet], tmp_path: Path
) -> None:
    fleet = private_fleet(hosts=3, gpus=1, replicas=2, gateway_args=("--kernel-pool-size", "0"))
    status, kernel = fleet.request("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    before = fleet.request("GET", f"/api/fleet/kernels/{kernel['id']}")[1]
    drained = before["replicas"][0]["host"]
    (tmp_path / ".kernelfleet-header").write_text(f"Authorization: token {fleet.token}\n")
    block = guide_block('curl -s -H @"$HOME/.kernelfleet-header" -X POST')
    *drain, stop = block.strip().splitlines()
    assert stop == "docker compose -f deploy/compose.yaml stop host-2"  # not run: no Compose
    script = "\n".join(drain).replace(GUIDE_URL, fleet.url).replace("host-2", drained)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"timeout 120 bash -c {shlex.quote(script)}"],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert '"why": "maintenance"' in done.stdout
    replicas = fleet.request("GET", f"/api/fleet/kernels/{kernel['id']}")[1]["replicas"]
    assert drained not in {r["host"] for r in replicas}
    wait_for(
        lambda: (
            sum(
                r["state"] == "ready"
                for r in fleet.request("GET", f"/api/fleet/kernels/{kernel['id']}")[1]["replicas"]
            )
            == 2
        ),
        60,
        "two ready replicas",
    )
    assert fleet.request("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
