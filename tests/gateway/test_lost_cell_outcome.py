"""A cell whose executor is lost is answered as it really ended.

The executor's reply can be lost with its process after the cell's state delta got into the
Raft log; the cell then completed, and its effects are in every replica. The gateway asks a
live replica (which first commits an entry of its own, so that nothing the lost executor got
committed is missed) and answers the cell ``ok``, saying its output was lost; a cell whose
delta never got into the log fails, saying its effects are not kept, and has none.
"""

from __future__ import annotations

import pytest

from kernelfleet.testing import wait_for

pytestmark = pytest.mark.timeout(180)

DROP_REPLY_THEN_DIE = """
import os, signal, threading
_kernel = get_ipython().kernel
_send = _kernel.session.send
def _drop_execute_replies(stream, msg_or_type, *args, **kwargs):
    if msg_or_type == "execute_reply":  # built as sent, never sent
        return _kernel.session.msg(msg_or_type, args[0], args[1])
    return _send(stream, msg_or_type, *args, **kwargs)
_kernel.session.send = _drop_execute_replies
threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
x = 2
"""
"""Fault double: the executor runs the cell, publishes its delta, never sends its reply, and
dies 2 s later (as when its reply was still queued when its host died)."""

DIE_MID_CELL = """
import os, signal, time
print("started", flush=True)
time.sleep(1)  # the gateway has seen the cell begin: it is not sent again
x = 3
os.kill(os.getpid(), signal.SIGKILL)
"""


DIE_BEFORE_IDLE = """
import os, signal
_kernel = get_ipython().kernel
_status = _kernel._publish_status
def _die_at_idle(status, *args, **kwargs):
    if status == "idle":  # the reply went out; the idle status never will
        os.kill(os.getpid(), signal.SIGKILL)
    return _status(status, *args, **kwargs)
_kernel._publish_status = _die_at_idle
x = 4
"""
"""Fault double: the executor answers the cell, then dies before its ``idle`` status."""


def stderr(result) -> str:
    return "".join(
        m["content"]["text"] for m in result.of_type("stream") if m["content"]["name"] == "stderr"
    )


async def test_a_cell_that_completed_before_its_executor_was_lost_is_answered_ok(fleet_factory):
    fleet = fleet_factory(hosts=3, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("x = 1")).reply["status"] == "ok"
        result = await client.execute(DROP_REPLY_THEN_DIE, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        assert "was lost after the cell completed" in stderr(result)
        assert (await client.execute("print(x)", timeout=60)).stdout == "2\n"
        wait_for(  # a second loss before the first is repaired would leave no majority
            lambda: fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["degraded"] is None,
            60,
            "the lost replica to be replaced",
        )

        result = await client.execute(DIE_MID_CELL, timeout=60)
        assert result.reply["status"] == "error", result.reply
        assert "the cell's effects are not kept" in result.reply["evalue"], fleet.log()[-6000:]
        assert (await client.execute("print(x)", timeout=60)).stdout == "2\n"
    finally:
        client.close()


async def test_a_cell_whose_executor_dies_between_reply_and_idle_ends_idle(fleet_factory):
    """The client got the reply; the gateway sends the idle status the lost executor never
    did, so a client waiting for idle (as JupyterLab's busy indicator and nbclient do) goes
    on at once instead of hanging (a chaos soak saw a client wait 30 s for it)."""
    fleet = fleet_factory(hosts=3, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        result = await client.execute(DIE_BEFORE_IDLE, timeout=20)
        assert result.reply["status"] == "ok", result.reply
        assert (await client.execute("print(x)", timeout=60)).stdout == "4\n"
    finally:
        client.close()
