"""The gateway's tool-workers service against one real host agent (no gateway process): a
group's GPUs are held while it lives and freed however it ends (deleted, its cell ended, its
host lost); the workers a lost host still runs are stopped when it reports again.

The kernel's cells are the test's `Cells` (a running cell or none), standing for the kernel
service, which the live test (`tests/gateway/test_tool_workers_live.py`) drives for real.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from kernelfleet.errors import Conflict, GpusUnavailable, NotFound
from kernelfleet.gateway.hosts import HostRegistry
from kernelfleet.gateway.ledger import GpuLedger, device_ids_of
from kernelfleet.gateway.tool_workers import RunningCell, ToolWorkerService
from kernelfleet.tools.pipeline.channel import TOKEN_ENV, Listener

from .conftest import TOKEN

MODULE = "kernelfleet.tools.pipeline.worker"


class Cells:
    """Kernel ``k``'s running cell: ``cell`` (None: it runs none); no kernel once ``gone``."""

    def __init__(self) -> None:
        self.cell: RunningCell | None = RunningCell("cell-1", None)
        self.gone = False

    def running_cell(self, kernel_id: str) -> RunningCell | None:
        if self.gone:
            raise NotFound(f"no kernel {kernel_id}")
        return self.cell


async def report(hosts: HostRegistry, ledger: GpuLedger, agent: Any, now: float) -> None:
    """What the gateway does with a heartbeat: the registry, then the ledger's spec."""
    body = await agent.client.host_info()
    host = hosts.report(agent.host_id, body, now)
    ledger.set_host(host.id, device_ids_of(host.gpus))


async def connected(listener: Listener, count: int) -> list[Any]:
    return [await asyncio.to_thread(listener.accept, 60.0) for _ in range(count)]


@pytest.mark.slow
async def test_a_groups_gpus_are_held_while_it_lives_and_freed_however_it_ends(host_agent):
    agent = await host_agent(gpus=2)
    hosts, ledger, cells = (
        HostRegistry(TOKEN, heartbeat_timeout=10),
        GpuLedger(checked=True),
        Cells(),
    )
    service = ToolWorkerService(hosts, ledger, cells, grace=2.0)
    await report(hosts, ledger, agent, now=0.0)
    ledger.subscribe(agent.host_id, "k", "r", 0)
    listener = Listener("secret")
    body = {"count": 2, "module": MODULE, "args": [listener.host, str(listener.port)],
            "args_each": [["0"], ["1"]], "env": {TOKEN_ENV: "secret"}}  # fmt: skip
    try:
        # deleted: both GPUs held while it runs, free after. Worker 1 fails at once: the group
        # runs on, and its log tail is fetched from its agent (the error path: a poll while
        # all run asks the agents nothing)
        group = await service.start("k", {**body, "args_each": [["0"], ["not-a-rank"]]})
        assert group.state == "running"
        assert ledger.holds(group.id) == {agent.host_id: ("0", "1")}
        (channel,) = await connected(listener, 1)
        with pytest.raises(Conflict, match="0 are free now"):
            await service.start("k", {**body, "count": 1, "args_each": [["0"]]})
        for now in range(1, 300):
            await report(hosts, ledger, agent, now=now / 100)
            if group.workers[1].state == "exited":
                break
            await asyncio.sleep(0.1)
        assert [worker.state for worker in group.workers] == ["running", "exited"]
        assert group.state == "running"
        await service.refresh_logs(group)
        assert "not-a-rank" in "\n".join(group.workers[1].log_tail)
        ended = await service.stop("k", group.id)
        assert (ended.state, ended.ended_why) == ("ended", "deleted")
        assert all(worker.state == "exited" for worker in ended.workers)
        assert ledger.holds(group.id) == {}
        assert ledger.breaches == 0
        channel.close()

        # its cell ended: the sweep ends it
        group = await service.start("k", {**body, "count": 1, "args_each": [["0"]]})
        (channel,) = await connected(listener, 1)
        cells.cell = RunningCell("cell-2", None)
        service.sweep()
        await asyncio.wait_for(service.ending(group), 30)
        assert group.ended_why == "cell cell-1 ended"
        assert ledger.holds(group.id) == {}
        channel.close()

        # its host lost: the devices go at once; what the host still runs is stopped when it
        # reports again
        cells.cell = RunningCell("cell-3", None)
        group = await service.start("k", {**body, "count": 1, "args_each": [["0"]]})
        (channel,) = await connected(listener, 1)
        hosts.check_liveness(now=100.0)
        await asyncio.wait_for(service.ending(group), 30)
        assert group.ended_why == f"host {agent.host_id} was lost"
        assert ledger.holds(group.id) == {}
        await report(hosts, ledger, agent, now=101.0)  # back: it still runs the worker

        for _ in range(300):
            if not (await agent.client.host_info())["workers"]:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the worker the lost host still ran was not stopped")
        channel.close()
    finally:
        listener.close()
        hosts.close()


@pytest.mark.slow
async def test_a_gone_kernels_gpus_stay_held_until_its_workers_are_known_gone(host_agent):
    """A group deleted while it starts ends once its launch answered. The kernel is deleted
    (the ledger loses its claims) while its worker runs, and the agent cannot answer the stop
    (frozen): the device stays held, so no cell can have it, until the agent, thawed, stops
    the worker and reports it gone."""
    agent = await host_agent(gpus=1)
    hosts, ledger, cells = (
        HostRegistry(TOKEN, heartbeat_timeout=10),
        GpuLedger(checked=True),
        Cells(),
    )
    service = ToolWorkerService(hosts, ledger, cells, grace=0.5)
    await report(hosts, ledger, agent, now=0.0)
    ledger.subscribe(agent.host_id, "k", "r", 0)
    ledger.subscribe(agent.host_id, "j", "r", 1)  # another kernel's cell wants the GPU
    listener = Listener("secret")
    body = {"count": 1, "module": MODULE, "args": [listener.host, str(listener.port), "0"],
            "env": {TOKEN_ENV: "secret"}}  # fmt: skip

    def device_is_held() -> bool:
        held = ledger.holds(group.id) == {agent.host_id: ("0",)}
        with pytest.raises(GpusUnavailable):
            ledger.commit(agent.host_id, "j", "r", "c", 1)
        return held

    try:
        # deleted while it starts: the launch is awaited, then what it started is stopped
        starting = asyncio.create_task(service.start("k", body))
        await asyncio.sleep(0)  # start() runs to its first await: the launch
        (group,) = service.groups("k")
        assert group.state == "starting"
        ended = await service.stop("k", group.id)
        assert ended.state == "ended"
        assert (await starting).state == "ended"
        assert ledger.holds(group.id) == {}
        assert (await agent.client.host_info())["workers"] == []

        group = await service.start("k", body)
        (channel,) = await connected(listener, 1)
        cells.gone = True
        ledger.remove_kernel("k")  # what the gateway does when the kernel is deleted
        assert device_is_held()

        client = hosts.get(agent.host_id).client
        client.launch_margin = 0.5  # the stop's budget: grace + this
        os.kill(agent.process.pid, signal.SIGSTOP)
        try:
            service.sweep()
            await asyncio.wait_for(service.ending(group), 30)
            assert (group.state, group.ended_why) == ("ending", "its kernel is gone")
            assert device_is_held()
        finally:
            os.kill(agent.process.pid, signal.SIGCONT)

        for now in range(1, 150):  # its reports (and the sweep's retries) end it
            await report(hosts, ledger, agent, now=float(now))
            service.sweep()
            if group.state == "ended":
                break
            await asyncio.sleep(0.1)
        assert group.state == "ended"
        assert all(worker.state == "exited" for worker in group.workers)
        assert ledger.holds(group.id) == {}
        assert ledger.commit(agent.host_id, "j", "r", "c", 1).device_ids == ("0",)
        assert ledger.breaches == 0
        channel.close()
    finally:
        listener.close()
        hosts.close()
