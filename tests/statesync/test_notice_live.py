"""The unsynced-value notice in a real replicated kernel: in the output of the cell that bound
the value (before its reply), once."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pair(fleet_factory):
    return fleet_factory(hosts=2, gpus=1, replicas=2)


def stderr(result) -> str:
    return "".join(
        m["content"]["text"]
        for m in result.iopub
        if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stderr"
    )


async def test_an_open_file_is_told_once_in_its_cells_output(pair):
    # a file any user can open: the kernel may run as a user of its own (docs/security.md)
    kernel_id = pair.start_kernel()
    client = await pair.connect(kernel_id)
    try:
        opened = await client.execute("import os\nhandle = open(os.devnull)\nkept = 1")
        assert opened.reply["status"] == "ok"
        assert stderr(opened) == (
            "kernelfleet: handle (an open file) stays on this replica: it cannot be copied to "
            "the kernel's other replicas, so a cell that runs on another one (for a free GPU, "
            "or after this one is lost) will not find it.\n"
        )
        for code in ["kept += 1", "handle = open(os.devnull)"]:
            again = await client.execute(code)
            assert again.reply["status"] == "ok"
            assert stderr(again) == "", "told once for the kernel's life"
    finally:
        client.close()
        pair.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
