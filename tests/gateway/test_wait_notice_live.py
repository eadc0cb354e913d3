"""The "waiting for a GPU" notice of a live gateway: a transient display, updated at most once a
second, and gone from the cell's output once it runs (so a saved notebook holds none of it).

A fleet of one host with one virtual GPU: a first kernel holds the GPU with a sleeping cell,
the second kernel's cell waits until the first is interrupted.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from datetime import datetime
from typing import Any

import nbformat
import pytest
from jupyter_server.gateway.gateway_client import GatewayClient
from nbclient import NotebookClient

from kernelfleet.extension.gateway_client import FleetKernelManager
from kernelfleet.gateway.wait_notice import MIN_INTERVAL

pytestmark = pytest.mark.timeout(180)

HOLD = "import time\nprint('holding', flush=True)\ntime.sleep(60)"
NOTICE = re.compile(r"kernelfleet: wait")


@pytest.fixture(scope="module")
def one_gpu(fleet_factory):
    return fleet_factory(hosts=1, gpus=1, replicas=1)


def queued(fleet) -> float:
    text = fleet.request_text("GET", "/metrics")
    found = re.search(r"^kernelfleet_queued_cells (\S+)$", text, re.M)
    assert found
    return float(found.group(1))


async def hold_the_gpu(fleet, client) -> str:
    msg_id = client.send("execute_request", {"code": HOLD})
    await client.wait_for_output(msg_id, "holding")
    return msg_id


async def release_when_queued(fleet, holder: str, wait: float) -> None:
    """Once a cell waits for the GPU, let it wait `wait` seconds more, then interrupt the
    kernel `holder` that holds the GPU."""
    while queued(fleet) < 1:  # noqa: ASYNC110 (a metric of another process: polled)
        await asyncio.sleep(0.1)
    await asyncio.sleep(wait)
    fleet.api("POST", f"/api/kernels/{holder}/interrupt", expect=204)


def front_end_outputs(iopub: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a front-end's output area holds after these messages (display ids, clearing)."""
    outputs: list[dict[str, Any]] = []
    for msg in iopub:
        msg_type, content = msg["header"]["msg_type"], msg["content"]
        if msg_type == "clear_output":
            outputs = []
        elif msg_type == "update_display_data":
            display_id = content["transient"]["display_id"]
            for output in outputs:
                if output.get("transient", {}).get("display_id") == display_id:
                    output["data"] = content["data"]
        elif msg_type in ("stream", "display_data", "execute_result", "error"):
            outputs.append({"type": msg_type, **content})
    return outputs


async def test_a_waiting_cell_gets_one_display_few_updates_and_no_trace(one_gpu):
    fleet = one_gpu
    holder = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    waiter = fleet.start_kernel("python3-1gpu")
    holding, waiting = await fleet.connect(holder), await fleet.connect(waiter)
    try:
        held = await hold_the_gpu(fleet, holding)
        cell = waiting.send("execute_request", {"code": "print('ran')"})
        # a wait past the gateway's 2 s re-check, which says the same text again
        await release_when_queued(fleet, holder, wait=2.5)
        result = await waiting.collect(cell, timeout=30)
        await holding.collect(held, timeout=30)
    finally:
        holding.close()
        waiting.close()
    assert result.reply["status"] == "ok"
    types = [m["header"]["msg_type"] for m in result.iopub]
    ran_at = types.index("execute_input")
    notice = result.iopub[: types.index("clear_output")]
    shown = [m for m in notice if m["header"]["msg_type"].endswith("display_data")]
    texts = [m["content"]["data"]["text/plain"] for m in shown]
    assert types[:2] == ["status", "display_data"], types
    assert "waiting for 1 GPU" in texts[0]
    assert len(shown) <= 2, f"{len(result.iopub)} messages: {texts}"
    assert all(a != b for a, b in itertools.pairwise(texts)), "a text sent twice"
    times = [datetime.fromisoformat(m["header"]["date"]) for m in shown]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(gap >= MIN_INTERVAL * 0.9 for gap in gaps), gaps
    assert types.index("clear_output") < ran_at, "cleared before the cell's own output"
    assert front_end_outputs(result.iopub) == [
        {"type": "stream", "name": "stdout", "text": "ran\n"}
    ]
    for kernel_id in (holder, waiter):
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


class RecordingClient(NotebookClient):
    """nbclient as papermill runs it, keeping every message it processed."""

    seen: list[dict[str, Any]]

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        self.seen.append(msg)
        return super().process_message(msg, cell, cell_index)


async def test_a_notebook_saved_after_a_cell_waited_holds_no_notice(one_gpu, tmp_path):
    fleet = one_gpu
    GatewayClient.instance(url=fleet.url, auth_token=fleet.token)
    holder = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    holding = await fleet.connect(holder)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print('ran')"), nbformat.v4.new_code_cell("1 + 1")]
    )
    km = FleetKernelManager(kernel_name="python3-1gpu")
    client = RecordingClient(notebook, km=km, timeout=60)
    client.seen = []
    try:
        held = await hold_the_gpu(fleet, holding)
        release = asyncio.ensure_future(release_when_queued(fleet, holder, wait=1.5))
        await client.async_execute()
        await release
        await holding.collect(held, timeout=30)
    finally:
        holding.close()
        await km.shutdown_kernel()
        GatewayClient.clear_instance()
    said = [m["content"]["data"]["text/plain"] for m in client.seen if "data" in m["content"]]
    assert any("waiting for 1 GPU" in text for text in said), "the first cell did wait"
    path = tmp_path / "waited.ipynb"
    nbformat.write(notebook, path)
    saved = nbformat.read(path, as_version=4)
    assert saved.cells[0].outputs == [nbformat.v4.new_output("stream", text="ran\n")]
    assert saved.cells[1].outputs[0]["data"] == {"text/plain": "2"}
    assert not NOTICE.search(path.read_text())
    fleet.api("DELETE", f"/api/kernels/{holder}", expect=204)
