"""``kernelfleet bridge``: jupyter_client reaches a fleet kernel by kernelspec name, and the
gateway kernel goes when the client shuts it down or the bridge is terminated."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
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


def readme_blocks(section: str) -> dict[str, str]:
    """The code blocks (by language) of the README section titled `section`."""
    text = (Path(__file__).parents[2] / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"```(\w+)\n(.*?)```", body, re.S))


def test_the_readme_example_runs_a_notebook_on_the_fleet(fleet, tmp_path, monkeypatch):
    blocks = readme_blocks("Any Jupyter client: `kernelfleet bridge`")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    script = blocks["bash"].replace("=TOKEN", f"={fleet.token}")
    script = script.replace("http://127.0.0.1:8765", fleet.url)
    done = subprocess.run(["bash", "-ec", script], capture_output=True, text=True, check=True)
    assert re.search(r"^\s+kernelfleet\s", done.stdout, re.M), done.stdout
    monkeypatch.chdir(tmp_path)
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]),
        "train.ipynb",
    )
    before = set(kernel_ids(fleet))
    namespace: dict = {}
    exec(blocks["python"], namespace)
    (cell,) = namespace["notebook"].cells
    assert cell.outputs[0]["text"] == "42\n"
    wait_for(lambda: set(kernel_ids(fleet)) <= before, 30, "the notebook's kernel to go")


def test_a_bridge_killed_with_its_process_group_leaves_no_gateway_kernel(kernelspec, fleet):
    """jupyter_client's ``shutdown_kernel(now=True)`` SIGKILLs the process group: the bridge's
    reaper, in a session of its own, deletes the kernel."""
    before = set(kernel_ids(fleet))
    manager, client = start_new_kernel(kernel_name="fleet-test", startup_timeout=90)
    client.stop_channels()
    (new,) = set(kernel_ids(fleet)) - before
    manager.shutdown_kernel(now=True)
    wait_for(lambda: new not in kernel_ids(fleet), 30, "the reaper to shut the kernel down")
