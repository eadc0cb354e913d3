"""The tool-workers service's parts without processes: what a request may ask, and which cell
of a kernel runs (and where) when its code asks for workers."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest, NotFound
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.records import CellRecord, KernelRecord, ReplicaRecord
from kernelfleet.gateway.tool_workers import KernelServiceCells, RunningCell, WorkersRequest

MODULE = "kernelfleet.tools.pipeline.worker"
NOWHERE = ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key")


def test_a_request_is_checked_field_by_field() -> None:
    request = WorkersRequest.from_json(
        {
            "count": 2,
            "module": MODULE,
            "args": ["h", "1"],
            "args_each": [["0"], ["1"]],
            "env": {"KERNELFLEET_PIPELINE_TOKEN": "t"},
        }
    )
    assert request.gpus_each == 1
    assert request.args_each == (("0",), ("1",))
    assert WorkersRequest.from_json({"count": 3, "module": MODULE}).args_each == ((), (), ())


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"module": MODULE}, "'count' must be an integer from 1"),
        ({"count": 0, "module": MODULE}, "'count'"),
        ({"count": True, "module": MODULE}, "'count'"),
        ({"count": 1, "gpus_each": 2000, "module": MODULE}, "'gpus_each'"),
        ({"count": 1, "module": "subprocess"}, "may not be started as a tool worker"),
        ({"count": 1}, "module None may not be started"),
        ({"count": 1, "module": MODULE, "env": {"PATH": "/x"}}, "may set only"),
        ({"count": 1, "module": MODULE, "args": "a b"}, "'args' must be a list of strings"),
        ({"count": 2, "module": MODULE, "args_each": [["0"]]}, "a list of 2 lists"),
        ({"count": 1, "module": MODULE, "args_each": [[0]]}, "'args_each' must be a list"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(body, complaint: str) -> None:
    with pytest.raises(InvalidRequest, match=complaint):
        WorkersRequest.from_json(body)


def test_the_running_cell_is_the_oldest_unfinished_on_the_host_of_its_gpus() -> None:
    kernels, ledger = KernelTable(), GpuLedger()
    kernel = KernelRecord("k", "python3", {})
    kernel.replicas = [ReplicaRecord("r1", "h1", NOWHERE), ReplicaRecord("r2", "h2", NOWHERE)]
    kernels.add(kernel)
    cells = KernelServiceCells(kernels, ledger)
    assert cells.running_cell("k") is None
    with pytest.raises(NotFound):
        cells.running_cell("nobody")

    kernel.recent_cells.append(CellRecord("c1", 0.0, outcome="ok"))
    kernel.recent_cells.append(CellRecord("c2", 1.0))  # sent, not heard started yet
    kernel.recent_cells.append(CellRecord("c3", 2.0))  # queued behind it
    assert cells.running_cell("k") == RunningCell("c2", "h1")  # no binding: the first replica
    kernel.executor = "r2"
    assert cells.running_cell("k") == RunningCell("c2", "h2")
    ledger.set_host("h1", ["0"])
    ledger.subscribe("h1", "k", "r1", 1)
    ledger.commit("h1", "k", "r1", "c2", 1)
    assert cells.running_cell("k") == RunningCell("c2", "h1")  # where its GPUs are bound
    kernel.recent_cells[1].host = "h3"  # the gateway heard it start there
    assert cells.running_cell("k") == RunningCell("c2", "h3")
    kernel.recent_cells[1].outcome = "ok"
    assert cells.running_cell("k") == RunningCell("c3", "h2")
