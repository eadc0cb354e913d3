"""HostReconciler: what host reports and losses do to the kernels' replicas."""

from __future__ import annotations

import asyncio

import pytest

from kernelfleet.gateway.background import Background
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.hosts import HostRecord
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.reconciler import HostReconciler
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord, ReplicaState
from kernelfleet.gateway.store import KernelStore

NOWHERE = ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key")


class Agent:
    """Stands in for a host's `HostAgentClient`: records what it is asked to stop."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    async def stop_replica(self, replica_id: str) -> None:
        self.stopped.append(replica_id)


class Loss:
    def __init__(self) -> None:
        self.died: list[tuple[str, str, str]] = []
        self.calls = 0

    def replicas_died(self, deaths: list[tuple[KernelRecord, ReplicaRecord, str]]) -> None:
        self.calls += bool(deaths)
        for kernel, replica, why in deaths:
            assert replica.state is ReplicaState.DEAD
            self.died.append((kernel.id, replica.id, why))


class Capacity:
    changes = 0

    def capacity_changed(self) -> None:
        self.changes += 1


@pytest.fixture
def world(tmp_path):
    table = KernelTable(KernelStore(tmp_path))
    kernel = KernelRecord(
        "k1",
        "python3",
        {},
        replicas_wanted=2,
        replicas=[
            ReplicaRecord("r1", "h1", NOWHERE, state=ReplicaState.READY),
            ReplicaRecord("r2", "h2", NOWHERE, state=ReplicaState.READY),
        ],
    )
    table.add(kernel)
    ledger = GpuLedger(checked=True)
    for replica in kernel.replicas:
        ledger.set_host(replica.host_id, ["0"])
        ledger.subscribe(replica.host_id, "k1", replica.id, 1)
    loss, capacity = Loss(), Capacity()
    reconciler = HostReconciler(table, ledger, capacity, loss, Background())
    return table, kernel, ledger, loss, capacity, reconciler


def host(host_id: str, replicas: list[dict], agent: Agent | None = None) -> HostRecord:
    gpus = [{"index": 0}]
    return HostRecord(host_id, "http://x", agent or Agent(), gpus, replicas)  # type: ignore[arg-type]


async def test_a_lost_host_gives_its_replicas_up_and_stops_them_if_it_comes_back(world) -> None:
    _, kernel, ledger, loss, capacity, reconciler = world
    reconciler.on_host_lost(host("h1", []))
    assert kernel.replicas[0].state is ReplicaState.DEAD
    assert kernel.replicas[1].state is ReplicaState.READY
    assert loss.died == [("k1", "r1", "host h1 was lost: it stopped answering")]
    assert "h1" not in ledger.hosts()
    assert capacity.changes == 1

    agent = Agent()
    reconciler.on_host_report(host("h1", [{"id": "r1", "state": "ready"}], agent), False)
    for _ in range(3):
        await asyncio.sleep(0)
    assert agent.stopped == ["r1"], "given up for dead: stopped where it still runs"
    reconciler.on_host_report(host("h1", [{"id": "r1", "state": "ready"}], agent), False)
    await asyncio.sleep(0)
    assert agent.stopped == ["r1"], "once"
    assert ledger.breaches == 0


def test_a_report_kills_exited_replicas_and_those_a_restarted_agent_forgot(world) -> None:
    _, kernel, _, loss, _, reconciler = world
    reconciler.on_host_report(host("h1", [{"id": "r1", "state": "ready", "pid": 9}]), False)
    assert (kernel.replicas[0].state, kernel.replicas[0].pid, loss.died) == (
        ReplicaState.READY, 9, [],
    )  # fmt: skip
    reconciler.on_host_report(host("h1", [{"id": "r1", "state": "dead", "exit_code": 3}]), False)
    assert loss.died == [("k1", "r1", "its process exited (3)")]

    reconciler.on_host_report(host("h2", []), False)
    assert kernel.replicas[1].state is ReplicaState.READY, "unlisted by a running agent: kept"
    reconciler.on_host_report(host("h2", []), True)
    assert kernel.replicas[1].state is ReplicaState.DEAD
    assert loss.died[-1] == ("k1", "r2", "the agent on h2 restarted")


async def test_a_lost_hosts_replicas_die_together(world) -> None:
    """One call for all of them: the kernels are written to the store once per lost host, not
    once per replica (40 writes held the gateway's loop for 4.9 s in a scale run)."""
    table, _, _, loss, _, reconciler = world
    for n in (2, 3):
        other = KernelRecord(
            f"k{n}", "python3", {}, replicas_wanted=2,
            replicas=[ReplicaRecord(f"r{n}", "h1", NOWHERE, state=ReplicaState.READY)],
        )  # fmt: skip
        table.add(other)
    reconciler.on_host_lost(host("h1", []))
    assert sorted(kernel_id for kernel_id, _, _ in loss.died) == ["k1", "k2", "k3"]
    assert loss.calls == 1
