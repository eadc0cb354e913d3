"""``kernelfleet bridge``: jupyter_client reaches a fleet kernel by kernelspec name, and the
gateway kernel goes when the client shuts it down or the bridge is terminated."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest
from jupyter_client.manager import start_new_kernel

from kernelfleet.testing import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def kernelspec(fleet, tmp_path, monkeypatch):
    """The README's ``kernelfleet bridge install``, into a prefix of the test's own."""
    env = {**os.environ, "KERNELFLEET_TOKEN": fleet.token}
    done = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "bridge", "install", "--gateway-url", fleet.url,
         "--name", "fleet-test", "--prefix", str(tmp_path)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "Installed kernelspec fleet-test" in done.stdout
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    return tmp_path / "share" / "jupyter" / "kernels" / "fleet-test"


def kernel_ids(fleet) -> list[str]:
    return [k["id"] for k in fleet.api("GET", "/api/kernels")]


def test_install_keeps_the_token_from_other_users(kernelspec, fleet):
    path = kernelspec / "kernel.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(kernelspec.stat().st_mode) == 0o700
    spec = json.loads(path.read_text())
    assert spec["env"] == {"KERNELFLEET_TOKEN": fleet.token}
    assert fleet.token not in spec["argv"]
    assert spec["argv"][1:5] == ["-m", "kernelfleet", "bridge", "-f"]


def test_a_client_runs_cells_on_the_fleet_and_its_shutdown_removes_the_kernel(kernelspec, fleet):
    before = set(kernel_ids(fleet))
    manager, client = start_new_kernel(kernel_name="fleet-test", startup_timeout=90)
    try:
        (new,) = set(kernel_ids(fleet)) - before
        outputs: list[str] = []

        def hook(msg):
            if msg["header"]["msg_type"] == "stream":
                outputs.append(msg["content"]["text"])

        reply = client.execute_interactive("x = 20\nprint(x * 2 + 2)", output_hook=hook, timeout=60)
        assert reply["content"]["status"] == "ok"
        assert outputs == ["42\n"]
        info = client.kernel_info(reply=True, timeout=30)["content"]
        assert info["implementation"] == "ipython"
        assert "kernelfleet" in info
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert not manager.is_alive()
    assert new not in kernel_ids(fleet)


def test_a_terminated_bridge_shuts_its_gateway_kernel_down(kernelspec, fleet):
    before = set(kernel_ids(fleet))
    manager, client = start_new_kernel(kernel_name="fleet-test", startup_timeout=90)
    client.stop_channels()
    (new,) = set(kernel_ids(fleet)) - before
    pid = manager.provisioner.process.pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: new not in kernel_ids(fleet), 30, "the bridge to shut its kernel down")
    manager.shutdown_kernel(now=True)
