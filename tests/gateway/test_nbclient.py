"""nbclient (and so papermill) executes notebooks on the fleet with no server in between."""

import nbformat
import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from nbclient import NotebookClient

from kernelfleet.extension.gateway_client import FleetKernelManager

pytestmark = pytest.mark.timeout(120)


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
