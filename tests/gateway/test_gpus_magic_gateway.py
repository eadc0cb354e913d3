"""``%%gpus N`` as the gateway reads it: the GPUs a cell holds are chosen from its first line.

Unit tests check `gpus_magic` and `cell_gpus` (the metadata first, then ``%%gpus N``). The live
tests run one host with one virtual GPU: ``%%gpus 1`` holds it while the cell runs, ``%%gpus 0``
runs without, and a bad N or more GPUs than the host has fail the cell at once, holding nothing.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.cells import UsageError, cell_gpus
from kernelfleet.gateway.framing import ClientMessage
from kernelfleet.protocol import ErrorName, gpu_request, gpus_magic
from kernelfleet.testing import wait_for

pytestmark = pytest.mark.timeout(240)

# ---- unit ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "gpus"),
    [
        ("%%gpus 1\nx = 1", 1),
        ("\n  \n%%gpus 0\nx = 1", 0),
        ("%%gpus\t2  \n", 2),
        ("%%gpus 12\n", 12),
        ("x = 1\n%%gpus 1", None),
        ("%%gpusx 1\n", None),
        ("%gpus 1\n", None),
        ("", None),
        ("%%gpus --help\n", None),
    ],
)
def test_gpus_magic_reads_the_first_non_blank_line(code, gpus):
    assert gpus_magic(code) == gpus


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("%%gpus -1\n", "cannot be negative"),
        ("%%gpus x\n", "not 'x'"),
        ("%%gpus 1.5\n", "not '1.5'"),
        ("%%gpus ²\n", "not '²'"),
        ("%%gpus\n", "needs a number"),
        ("%%gpus 1 2\n", "not '1 2'"),
    ],
)
def test_gpus_magic_refuses_a_bad_n_with_the_usage(code, why):
    with pytest.raises(InvalidRequest) as refused:
        gpus_magic(code)
    assert why in refused.value.message
    assert "usage: %%gpus N" in refused.value.message


def message(code: str, metadata: dict | None = None) -> ClientMessage:
    parts = [{"msg_id": "c1"}, {}, metadata or {}, {"code": code}]
    return ClientMessage("shell", "execute_request", "c1", [json.dumps(p).encode() for p in parts])


def test_the_metadata_wins_over_the_magic_line():
    assert cell_gpus(message("%%gpus 2\nx", gpu_request(0))) == 0
    assert cell_gpus(message("%%gpus 2\nx")) == 2
    assert cell_gpus(message("x = 1")) is None
    assert cell_gpus(message("%%gpus x\n", gpu_request(1))) == 1, "the metadata decides"


def test_a_bad_magic_line_is_a_usage_error_named_as_ipython_names_it():
    with pytest.raises(UsageError) as refused:
        cell_gpus(message("%%gpus -3\nx = 1"))
    assert UsageError.__name__ == ErrorName.USAGE_ERROR
    assert "negative" in refused.value.message


# ---- live ----------------------------------------------------------------------------------


def first_line(stdout: str) -> str:
    """What the cell printed itself (the %%gpus magic then reports the devices it got)."""
    return stdout.splitlines()[0] if stdout else ""


SHOW = "%%gpus {n}\nimport os, time\nprint('gpus=' + os.environ['KERNELFLEET_GPUS'], flush=True)\n"


@pytest.fixture(scope="module")
def one_gpu(fleet_factory):
    """One host with one GPU: one replica per kernel, so the one replica is where cells run."""
    return fleet_factory(hosts=1, gpus=1, replicas=1)


def committed(fleet) -> int:
    return sum(host["gpus"]["committed"] for host in fleet.api("GET", "/api/fleet/hosts"))


@contextlib.asynccontextmanager
async def kernel_client(fleet):
    """A new kernel's websocket client, the stand-in magic registered; the kernel goes after."""
    kernel_id = fleet.start_kernel()
    ws = await fleet.connect(kernel_id)
    try:
        ws.kernel_id = kernel_id
        yield ws
    finally:
        ws.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_gpus_1_holds_a_gpu_while_the_cell_runs(one_gpu):
    async with kernel_client(one_gpu) as client:
        msg_id = client.send("execute_request", {"code": SHOW.format(n=1) + "time.sleep(3)"})
        await client.wait_for_output(msg_id, "gpus=")
        assert committed(one_gpu) == 1, "the cell holds the host's GPU while it runs"
        result = await client.collect(msg_id, timeout=30)
        assert result.reply["status"] == "ok", result.reply
        assert first_line(result.stdout) == "gpus=0", "device 0 bound in the cell"
        wait_for(lambda: committed(one_gpu) == 0, 5, "the GPU to come back")


async def test_gpus_0_runs_without_a_gpu_and_metadata_wins(one_gpu):
    async with kernel_client(one_gpu) as client:
        result = await client.request("execute_request", {"code": SHOW.format(n=0)}, timeout=30)
        assert result.reply["status"] == "ok", result.reply
        assert first_line(result.stdout) == "gpus="
        # the metadata wins over the magic line
        result = await client.request(
            "execute_request", {"code": SHOW.format(n=1)}, metadata=gpu_request(0), timeout=30
        )
        assert first_line(result.stdout) == "gpus=", "metadata 0 beats %%gpus 1"
        # and the magic line over the kernel's default
        one_gpu.api("PUT", f"/api/fleet/kernels/{client.kernel_id}/gpus", {"gpus": 1})
        plain = "import os\nprint('gpus=' + os.environ['KERNELFLEET_GPUS'])"
        result = await client.request("execute_request", {"code": plain}, timeout=30)
        assert first_line(result.stdout) == "gpus=0", "the default of 1 GPU applies"
        result = await client.request("execute_request", {"code": SHOW.format(n=0)}, timeout=30)
        assert first_line(result.stdout) == "gpus=", "%%gpus 0 beats the default"


@pytest.mark.parametrize(
    ("n", "ename", "why"),
    [
        ("-1", ErrorName.USAGE_ERROR, "cannot be negative"),
        ("x", ErrorName.USAGE_ERROR, "not 'x'"),
        ("99", "NoCapacity", "needs 99 GPU(s) on one host; the largest has 1"),
    ],
)
async def test_a_bad_n_fails_the_cell_at_once_holding_nothing(one_gpu, n, ename, why):
    async with kernel_client(one_gpu) as client:
        started = time.monotonic()
        msg_id = client.send("execute_request", {"code": SHOW.format(n=n) + "print('ran')"})
        result = await client.collect(msg_id, timeout=30)
        assert time.monotonic() - started < 5, "at once: the cell does not wait"
        assert result.reply["status"] == "error"
        assert result.reply["ename"] == ename, result.reply
        assert why in result.reply["evalue"], result.reply
        errors = result.of_type("error")
        assert [e["content"]["ename"] for e in errors] == [ename], "shown in the cell's output"
        assert "ran" not in result.stdout
        assert committed(one_gpu) == 0


async def test_metadata_asking_more_than_any_host_has_says_the_same(one_gpu):
    async with kernel_client(one_gpu) as client:
        by_magic = await client.request("execute_request", {"code": SHOW.format(n=99)}, timeout=30)
        by_metadata = await client.request(
            "execute_request", {"code": "print('ran')"}, metadata=gpu_request(99), timeout=30
        )
        for result in (by_magic, by_metadata):
            assert result.reply["ename"] == "NoCapacity", result.reply
        assert by_magic.reply["evalue"] == by_metadata.reply["evalue"]
        assert committed(one_gpu) == 0
