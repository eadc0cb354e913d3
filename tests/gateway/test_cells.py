"""CellQueue: a cell's error stops its client's later cells, whichever of its replica's idle
status and error reply reaches the gateway first (ipykernel's test_execute_stop_on_error)."""

from __future__ import annotations

import asyncio
import json
import time

from kernelfleet.gateway.cells import Assignment, Cell, CellOutcome, CellQueue
from kernelfleet.gateway.framing import ClientMessage


class Client:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.unsent: list[tuple[str, str]] = []

    def show_cell_status(self, cell: Cell, text: str) -> None:
        pass

    def end_unsent_cell(self, cell: Cell, ename: str, why: str) -> None:
        self.unsent.append((cell.id, ename))

    async def send_cell(self, cell: Cell, assignment: Assignment, yielders: list[str]) -> None:
        self.sent.append(cell.id)


def cell(client: Client, msg_id: str) -> Cell:
    parts = [json.dumps({"msg_id": msg_id}).encode(), b"{}", b"{}", b'{"code": ""}']
    message = ClientMessage("shell", "execute_request", msg_id, parts)
    return Cell(message, client, None, True, time.monotonic())


async def test_an_error_reply_after_the_idle_status_still_aborts_the_later_cells():
    client = Client()

    async def assign(c: Cell) -> Assignment:
        return Assignment("r-1")

    async def dispatch(c: Cell, assignment: Assignment) -> None:
        await client.send_cell(c, assignment, [])

    queue = CellQueue("k", assign, dispatch)
    first, second, third = (cell(client, i) for i in ("a", "b", "c"))
    for c in (first, second, third):
        queue.submit(c)
    await asyncio.sleep(0.05)
    assert client.sent == ["a"]
    queue.mark_running("a", "r-1")
    queue.finish_idle("a", "r-1")  # the idle status overtook the reply
    await asyncio.sleep(0.05)
    queue.finish("a", CellOutcome.ERROR, "r-1")
    await asyncio.sleep(0.05)
    assert client.sent == ["a"]
    assert client.unsent == [("b", "aborted"), ("c", "aborted")]
    assert first.outcome is CellOutcome.ERROR
    queue.close("done")


async def test_a_cell_whose_reply_never_comes_ends_on_its_idle_status():
    client = Client()

    async def assign(c: Cell) -> Assignment:
        return Assignment("r-1")

    async def dispatch(c: Cell, assignment: Assignment) -> None:
        await client.send_cell(c, assignment, [])

    queue = CellQueue("k", assign, dispatch)
    first, second = cell(client, "a"), cell(client, "b")
    queue.submit(first)
    queue.submit(second)
    await asyncio.sleep(0.05)
    queue.mark_running("a", "r-1")
    queue.finish_idle("a", "r-1")
    await asyncio.wait_for(first.ended, 3)
    assert first.outcome is CellOutcome.IDLE
    await asyncio.sleep(0.05)
    assert client.sent == ["a", "b"]
    queue.close("done")


class Watcher:
    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def cell_queued(self, cell: Cell, queued: int) -> None:
        self.heard.append(("queued", cell.id))

    def cell_started(self, cell: Cell, assignment: Assignment) -> None:
        self.heard.append(("started", cell.id))

    def cell_finished(self, cell: Cell) -> None:
        self.heard.append(("finished", cell.id))


async def test_a_reply_read_before_its_execute_input_still_starts_the_cell():
    """Shell and IOPub are read by pumps of their own: a fast cell's execute_reply can be seen
    before the execute_input that marks it running. Its start is still heard, once."""
    client, watcher = Client(), Watcher()

    async def assign(c: Cell) -> Assignment:
        return Assignment("r-1")

    async def dispatch(c: Cell, assignment: Assignment) -> None:
        await client.send_cell(c, assignment, [])

    queue = CellQueue("k", assign, dispatch, watcher)
    fast = cell(client, "a")
    queue.submit(fast)
    await asyncio.sleep(0.05)
    queue.finish("a", CellOutcome.OK, "r-1")  # the reply first
    await asyncio.wait_for(fast.ended, 3)
    await asyncio.sleep(0.05)  # the queue has moved on
    queue.mark_running("a", "r-1")  # then its execute_input: nothing more
    assert watcher.heard == [("queued", "a"), ("started", "a"), ("finished", "a")]
    assert fast.outcome is CellOutcome.OK
    queue.close("done")
