"""The limits on what the gateway holds per kernel, raised so that it holds hundreds.

A gateway and a host agent started with a low soft limit of open files (1024 is common on Linux;
256 here, to need few kernels) raise it to their hard limit: each kernel holds ~11 of the
gateway's descriptors with one replica. Before, the 21st kernel or so failed with EMFILE at a
soft limit of 256 (every ZMQ socket and websocket past the limit) and the gateway's accept loop
spun on the error. And the gateway's ZMQ context holds more than ZMQ's default of 1023 sockets:
3 per replica for each client websocket, 2 more per replica.
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from jupyter_client.kernelspec import KernelSpecManager

from kernelfleet.kernels.agent.replicas import ReplicaTable
from kernelfleet.limits import max_sockets
from kernelfleet.testing import TOKEN, Fleet

SOFT = 256
KERNELS = 30  # ~11 descriptors each: ~350 in the gateway, beyond SOFT
LOW_SOFT_LIMIT = ("prlimit", f"--nofile={SOFT}:", "--")  # execs: the process keeps its pid


def soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open files limit for {pid}")


@pytest.mark.parametrize(("soft", "hard"), [(SOFT, 2048), (2048, 2048)])
def test_raising_sets_the_soft_limit_to_the_hard_one(soft: int, hard: int) -> None:
    script = (
        "import resource; from kernelfleet.limits import raise_open_files_limit; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        "l = raise_open_files_limit(); print(l.before, l.after, l.hard, "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(soft), str(hard), str(hard), str(hard)]


def test_a_zmq_context_may_hold_as_many_sockets_as_files() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert max_sockets(65535) == min(soft, 65535)
    assert max_sockets(100) == min(soft, 100)


async def test_a_host_agent_holds_as_many_zmq_sockets_as_files(tmp_path: Path) -> None:
    """Each replica's kernel manager keeps a control socket in the agent's one context."""
    table = ReplicaTable(
        state_dir=tmp_path, kernel_spec_manager=KernelSpecManager(), root_dir=tmp_path
    )
    try:
        context = table._zmq_context
        assert context.get(zmq.MAX_SOCKETS) == max_sockets(context.get(zmq.SOCKET_LIMIT))
    finally:
        await table.stop_all(grace=5)


WEBSOCKETS = 360  # 3 ZMQ sockets each on a kernel of one replica: beyond ZMQ's default 1023


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gateway_holds_more_zmq_sockets_than_zmq_allows_by_default(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 8 * WEBSOCKETS:
        pytest.skip(f"the hard limit of open files ({hard}) is below what this test opens")
    fleet = Fleet(state_dir=tmp_path, token=TOKEN, env={})
    try:
        fleet.start_gateway("--replicas", "1")
        fleet.start_host("host-1", 2)
        asyncio.run(open_websockets_to_one_kernel(fleet, WEBSOCKETS))
        assert "Too many open files" not in fleet.log("gateway")
    finally:
        fleet.stop()


async def open_websockets_to_one_kernel(fleet: Fleet, count: int) -> None:
    """`count` websockets to one kernel, all open at once; the first and the last run a cell."""
    kernel_id = await asyncio.to_thread(fleet.start_kernel)
    clients = []
    try:
        for _ in range(count):
            clients.append(await fleet.connect(kernel_id))
        for client in (clients[-1], clients[0]):
            assert (await client.execute("x = 1", timeout=60)).reply["status"] == "ok"
    finally:
        for client in clients:
            client.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gateway_started_with_a_low_soft_limit_holds_more_kernels(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4 * SOFT:
        pytest.skip(f"the hard limit ({hard}) leaves no room above {SOFT}")
    fleet = Fleet(state_dir=tmp_path, token=TOKEN, env={})
    try:
        fleet.start_gateway("--replicas", "1", launcher=LOW_SOFT_LIMIT)
        fleet.start_host("host-1", 2, launcher=LOW_SOFT_LIMIT)
        assert fleet.gateway is not None
        assert soft_limit_of(fleet.gateway.pid) == hard
        assert soft_limit_of(fleet.hosts["host-1"].pid) == hard
        assert f"open files limit raised from {SOFT} to {hard}" in fleet.log("gateway")
        asyncio.run(open_kernels_and_run_a_cell_in_each(fleet, KERNELS))
        assert "Too many open files" not in fleet.log("gateway")
    finally:
        fleet.stop()


async def open_kernels_and_run_a_cell_in_each(fleet: Fleet, count: int) -> None:
    """`count` kernels, all with a websocket open at once, each answering a cell."""
    kernels = []
    try:
        for _ in range(count):
            kernel_id = await asyncio.to_thread(fleet.start_kernel)
            kernels.append(await fleet.connect(kernel_id))
        replies = await asyncio.gather(
            *(kernel.execute("x = 1", timeout=120) for kernel in kernels)
        )
        assert [reply.reply["status"] for reply in replies] == ["ok"] * count
    finally:
        for kernel in kernels:
            kernel.close()
