"""A host that comes back after its replicas were replaced: its strays are stopped, nothing runs
twice.

Three ways a host goes and comes back: it stops answering (SIGSTOP of the agent and its
replicas, seen by the link's unanswered pings) and is continued; its network is cut (every
cable pulled, in network namespaces) and healed; its agent is killed and restarted (the link's
close). Each time the kernel moves on without the host's replica (replaced on a spare host, or,
on a full fleet, on the host itself once it is back), every cell runs exactly once, and the old
replica does not run on beside the new one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kernelfleet.testing import Fleet, descendants, kill_all, pid_alive, wait_for
from kernelfleet.testing.netns import (
    CONTROL,
    RAFT,
    Topology,
)

HOSTS = 3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

COUNT = "runs.append(1); print(len(runs))"
"""A cell whose output says how often cells like it ran: run twice, it would skip a number."""


def kernel(fleet, kernel_id: str) -> dict:
    return fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")


def replaced_off(fleet, kernel_id: str, host: str) -> list[dict] | None:
    """The kernel's replicas once it is whole again with none on `host`."""
    model = kernel(fleet, kernel_id)
    hosts = {r["host"] for r in model["replicas"] if r["state"] in ("ready", "executing")}
    return model["replicas"] if model["degraded"] is None and host not in hosts else None


@contextlib.asynccontextmanager
async def counting_kernel(fleet) -> AsyncIterator[tuple[Any, str, dict]]:
    """A kernel that ran one `COUNT` cell: (its client, its id, its executor's model); closed
    and deleted on the way out."""
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        assert (await client.execute("runs = []")).reply["status"] == "ok"
        assert (await client.execute(COUNT)).stdout == "1\n"
        model = kernel(fleet, kernel_id)
        (executor,) = [r for r in model["replicas"] if r["id"] == model["executor"]]
        yield client, kernel_id, executor
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def signal_whole_host(fleet, host_id: str, signum: int) -> None:
    """`signum` to the host's agent and everything under it (its replicas run in sessions of
    their own), without waiting for them."""
    agent = fleet.hosts[host_id].pid
    below = descendants(agent)
    os.killpg(agent, signum)
    kill_all(below, signum)


async def test_a_silent_host_is_lost_within_seconds_and_when_it_answers_again_its_stray_stops(
    fleet_factory,
):
    fleet = fleet_factory(hosts=4, gpus=1, replicas=3)
    async with counting_kernel(fleet) as (client, kernel_id, executor):
        host = executor["host"]

        signal_whole_host(fleet, host, signal.SIGSTOP)
        try:
            assert (await client.execute(COUNT, timeout=60)).stdout == "2\n", "failed over"
            wait_for(lambda: fleet.host_state(host) == "lost", 30, f"{host} to be lost")
            (lost,) = [
                e for e in fleet.api("GET", "/api/fleet/events?n=1000") if e["type"] == "host-lost"
            ]
            assert "answered no ping" in lost["data"]["why"], "seen by the link, not heartbeats"
            wait_for(lambda: replaced_off(fleet, kernel_id, host), 60, "a replacement")
        finally:
            signal_whole_host(fleet, host, signal.SIGCONT)

        wait_for(lambda: fleet.host_state(host) == "alive", 30, f"{host} to be back")
        wait_for(lambda: not pid_alive(executor["pid"]), 30, "the stray replica to be stopped")
        assert f"still runs replica {executor['id']}, given up for dead: stopping it" in fleet.log()
        assert replaced_off(fleet, kernel_id, host), "the kernel did not move back"
        assert (await client.execute(COUNT, timeout=60)).stdout == "3\n", "nothing ran twice"


async def test_a_restarted_agents_old_replicas_are_gone_and_nothing_runs_twice(fleet_factory):
    fleet = fleet_factory(hosts=4, gpus=1, replicas=3)
    async with counting_kernel(fleet) as (client, kernel_id, executor):
        host = executor["host"]

        os.killpg(fleet.hosts[host].pid, signal.SIGKILL)  # the agent alone
        fleet.hosts[host].wait(10)
        assert (await client.execute(COUNT, timeout=60)).stdout == "2\n", "failed over"
        fleet.start_host(host, 1)

        wait_for(lambda: replaced_off(fleet, kernel_id, host), 60, "a replacement elsewhere")
        wait_for(lambda: not pid_alive(executor["pid"]), 30, "the old replica to be gone")
        agent = fleet.api("GET", f"/api/fleet/hosts/{host}")
        assert agent["state"] == "alive"
        assert (await client.execute(COUNT, timeout=60)).stdout == "3\n", "nothing ran twice"


@pytest.fixture
def cut_off(partitioned) -> tuple[Fleet, Topology]:
    """A gateway in the root namespace and one host agent in each of 3 namespaces
    (the ``partitioned`` fixture's topology); kernels get 3 replicas."""
    return partitioned.fleet, partitioned.topology


def cables(topology: Topology, i: int, state: str) -> None:
    """Host i's control and Raft cables ``down`` (cut) or ``up`` (healed)."""
    if state == "down":
        topology.cut(i, (CONTROL, RAFT))
    else:
        topology.heal(i, (CONTROL, RAFT))


@pytest.mark.timeout(240)
async def test_a_host_cut_off_is_lost_and_when_healed_its_stray_stops_on_a_full_fleet(cut_off):
    fleet, topology = cut_off
    async with counting_kernel(fleet) as (client, kernel_id, executor):
        host = executor["host"]
        i = int(host.split("-")[1])

        cables(topology, i, "down")
        try:
            assert (await client.execute(COUNT, timeout=90)).stdout == "2\n", "failed over"
            wait_for(lambda: fleet.host_state(host) == "lost", 30, f"{host} to be lost")
            degraded = wait_for(
                lambda: kernel(fleet, kernel_id)["degraded"], 30, "the kernel to be degraded"
            )
            assert f"replica {executor['id']} on {host} died" in degraded["reason"]
            assert pid_alive(executor["pid"]), "cut off, not dead: a stray when the host is back"
        finally:
            cables(topology, i, "up")

        wait_for(lambda: fleet.host_state(host) == "alive", 30, f"{host} to be back")
        wait_for(lambda: not pid_alive(executor["pid"]), 30, "the stray replica to be stopped")
        assert f"still runs replica {executor['id']}, given up for dead: stopping it" in fleet.log()

        def whole() -> list[dict] | None:
            model = kernel(fleet, kernel_id)
            return model["replicas"] if model["degraded"] is None else None

        replicas = wait_for(whole, 90, "the replacement on the healed host")
        assert executor["id"] not in {r["id"] for r in replicas}
        assert sorted(r["host"] for r in replicas) == ["host-1", "host-2", "host-3"]
        assert (await client.execute(COUNT, timeout=60)).stdout == "3\n", "nothing ran twice"
