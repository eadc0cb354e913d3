"""nbclient (and so papermill) executes notebooks on the fleet with no server in between."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from nbclient import NotebookClient

from kernelfleet.extension.gateway_client import FleetKernelManager

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_nbclient_runs_a_notebook_on_the_fleet(fleet):
    GatewayClient.instance(url=fleet.url, auth_token=fleet.token)
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import numpy as np\nweights = np.ones(3)"),
            nbformat.v4.new_code_cell("print(weights.sum())"),
        ]
    )
    km = FleetKernelManager(kernel_name="python3")
    client = NotebookClient(notebook, km=km, timeout=60)
    await client.async_execute()
    assert notebook.cells[1].outputs[0]["text"] == "3.0\n"
    assert km.kernel_id in [k["id"] for k in fleet.api("GET", "/api/fleet/kernels")]
    await km.shutdown_kernel()
    assert km.kernel_id not in [k["id"] for k in fleet.api("GET", "/api/kernels")]
    GatewayClient.clear_instance()


async def test_nbclient_starts_the_kernelspec_its_manager_names(fleet):
    """nbclient calls ``start_kernel()`` with no name: the manager's own kernelspec starts,
    here the one-GPU variant, whose cells run with a GPU bound."""
    GatewayClient.instance(url=fleet.url, auth_token=fleet.token)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import os\nprint(os.environ['KERNELFLEET_GPUS'])")]
    )
    km = FleetKernelManager(kernel_name="python3-1gpu")
    try:
        await NotebookClient(notebook, km=km, timeout=60).async_execute()
        model = fleet.api("GET", f"/api/kernels/{km.kernel_id}")
        assert model["name"] == "python3-1gpu"
        assert fleet.api("GET", f"/api/fleet/kernels/{km.kernel_id}")["gpus"] == 1
        (bound,) = notebook.cells[0].outputs[0]["text"].split()
        assert len(bound.split(",")) == 1
    finally:
        if km.has_kernel:
            await km.shutdown_kernel()
        GatewayClient.clear_instance()


def readme_block(after: str) -> str:
    """The first ```python block of README.md after the line `after`."""
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_readmes_nbclient_script_runs_as_written(fleet, tmp_path):
    """The README's script, run as a user runs it (a plain synchronous Python process), leaves
    no kernel behind and no coroutine unawaited."""
    script = readme_block("## Run notebooks from scripts")
    script = script.replace("http://127.0.0.1:8765", fleet.url).replace(
        '"TOKEN"', repr(fleet.token)
    )
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nbformat.write(notebook, tmp_path / "train.ipynb")
    script += "\nprint(notebook.cells[0].outputs[0]['text'], end='')\n"
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"
    assert fleet.api("GET", "/api/kernels") == []
