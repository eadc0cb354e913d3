"""GPU kernelspecs as JupyterLab's launcher reads them: jupyter_server in gateway mode, in front
of the shared fleet (3 hosts x 2 virtual GPUs, one replica per kernel)."""

from __future__ import annotations

import ast
import json

import pytest

from kernelfleet.testing import KernelWebsocket

pytestmark = pytest.mark.timeout(120)

SHOW_GPUS = "import os; print(repr(os.environ['KERNELFLEET_GPUS']))"


async def test_the_launcher_lists_gpu_kernelspecs_and_one_starts_with_its_gpus(
    jp_fetch, jp_ws_fetch, fleet
):
    specs = json.loads((await jp_fetch("api", "kernelspecs")).body)["kernelspecs"]
    assert {"python3", "python3-1gpu", "python3-2gpu"} <= set(specs)
    assert "python3-4gpu" not in specs, "no host has 4 GPUs"
    assert specs["python3-1gpu"]["spec"]["display_name"].endswith(" · 1 GPU")
    assert specs["python3-2gpu"]["spec"]["display_name"].endswith(" · 2 GPUs")
    logo = await jp_fetch("kernelspecs", "python3-2gpu", "logo-64x64.png")
    assert logo.body.startswith(b"\x89PNG")

    for name, devices in [("python3-2gpu", 2), ("python3", 0)]:
        body = json.dumps({"name": name})
        kernel = json.loads((await jp_fetch("api", "kernels", method="POST", body=body)).body)
        assert kernel["name"] == name
        ws = await jp_ws_fetch("api", "kernels", kernel["id"], "channels")
        client = KernelWebsocket(ws)
        try:
            result = await client.execute(SHOW_GPUS)
            bound = ast.literal_eval(result.stdout)  # the cell's device ids, comma-separated
            assert len([d for d in bound.split(",") if d]) == devices, result.stdout
        finally:
            ws.close()
            await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
