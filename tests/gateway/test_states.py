"""The gateway's state machines: replicas, hosts and cell outcomes move only along their tables,
and an illegal move raises an error naming the record, its state and the move."""

from __future__ import annotations

import asyncio

import pytest

from kernelfleet.gateway.cells import CELL_TRANSITIONS, Cell, CellOutcome
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.framing import ClientMessage
from kernelfleet.gateway.hosts import (
    HOST_TRANSITIONS,
    HostRecord,
    HostRegistry,
    HostState,
)
from kernelfleet.gateway.records import (
    REPLICA_TRANSITIONS,
    KernelRecord,
    ReplicaRecord,
    ReplicaState,
)
from kernelfleet.states import IllegalTransition

NOWHERE = ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key")
REPORT = {"address": "http://127.0.0.1:1", "gpus": [], "replicas": []}


def replica(state: ReplicaState = ReplicaState.STARTING) -> ReplicaRecord:
    return ReplicaRecord("k1-r1", "h1", NOWHERE, state=state)


@pytest.mark.parametrize(
    "table", [REPLICA_TRANSITIONS, HOST_TRANSITIONS, CELL_TRANSITIONS], ids=lambda t: "table"
)
def test_every_state_has_a_row_and_leads_only_to_states_of_its_kind(table) -> None:
    kind = type(next(iter(table)))
    assert set(table) == set(kind)
    for state, targets in table.items():
        assert all(isinstance(t, kind) for t in targets)
        assert state not in targets, f"{state} may not repeat itself"


def test_the_values_are_the_strings_the_apis_and_the_store_use() -> None:
    assert [s.value for s in ReplicaState] == [
        "starting", "ready", "restarting", "catching-up", "dead", "stopped",
    ]  # fmt: skip
    assert HostState.ALIVE.value == "alive"
    assert HostState.LOST.value == "lost"
    assert {o.value for o in CellOutcome} >= {"ok", "error", "aborted", "idle", "lost", "retry"}


def test_an_illegal_replica_transition_names_the_replica_its_state_and_the_move() -> None:
    dead = replica(ReplicaState.DEAD)
    with pytest.raises(IllegalTransition) as caught:
        dead.move_to(ReplicaState.CATCHING_UP)
    assert str(caught.value).startswith("replica k1-r1: illegal transition dead -> catching-up")
    assert caught.value.record == "replica k1-r1"
    assert caught.value.state is ReplicaState.DEAD
    assert caught.value.attempted is ReplicaState.CATCHING_UP
    assert dead.state is ReplicaState.DEAD, "a refused move changes nothing"


def test_a_replica_moves_along_its_table() -> None:
    joining = replica(ReplicaState.CATCHING_UP)
    joining.move_to(ReplicaState.READY)
    joining.move_to(ReplicaState.DEAD)
    joining.move_to(ReplicaState.READY)  # a restart brings it back
    assert joining.state is ReplicaState.READY
    with pytest.raises(IllegalTransition, match="ready -> ready"):
        joining.move_to(ReplicaState.READY)


def test_a_host_report_never_raises_it_is_taken_or_left_for_the_next_one() -> None:
    record = replica()
    record.update({"state": "ready", "pid": 7})
    assert (record.state, record.pid) == (ReplicaState.READY, 7)
    record.update({"state": "starting"})  # a heartbeat overtaken by the start call's answer
    assert record.state is ReplicaState.READY
    record.update({"state": "exploded"})
    assert record.state is ReplicaState.READY
    record.update({"pid": 8})  # no state: only what it says changes
    assert (record.state, record.pid) == (ReplicaState.READY, 8)

    joining = replica(ReplicaState.CATCHING_UP)
    joining.update({"state": "ready"})
    assert joining.state is ReplicaState.CATCHING_UP, "caught up only when the gateway says so"
    joining.update({"state": "dead"})
    assert joining.state is ReplicaState.DEAD


def test_the_stored_state_round_trips_and_the_admin_model_shows_strings() -> None:
    kernel = KernelRecord("k1", "python3", {}, replicas=[replica(ReplicaState.CATCHING_UP)])
    again = KernelRecord.from_state(kernel.to_state())
    assert again.replicas[0].state is ReplicaState.CATCHING_UP
    assert kernel.to_state()["replicas"][0]["state"] == "catching-up"
    assert kernel.fleet_model()["replicas"][0]["state"] == "catching-up"
    assert [r.id for r in kernel.linkable_replicas()] == []
    assert [r.id for r in kernel.live_replicas()] == ["k1-r1"]
    assert not kernel.dead
    kernel.replicas[0].move_to(ReplicaState.DEAD)
    assert kernel.dead


class Listener:
    def __init__(self) -> None:
        self.lost: list[tuple[str, HostState]] = []
        self.reports: list[tuple[str, bool]] = []

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        self.reports.append((host.id, restarted))

    def on_host_lost(self, host: HostRecord) -> None:
        self.lost.append((host.id, host.state))


def registry() -> tuple[HostRegistry, Listener]:
    hosts, listener = HostRegistry("token-123456", heartbeat_timeout=5.0), Listener()
    hosts.listen(listener)
    hosts.report("h1", REPORT, now=0.0)
    return hosts, listener


def test_an_illegal_host_transition_names_the_host_its_state_and_the_move() -> None:
    hosts, _ = registry()
    host = hosts.get("h1")
    host.move_to(HostState.DRAINING)
    host.move_to(HostState.STOPPING)
    with pytest.raises(IllegalTransition) as caught:
        host.move_to(HostState.ALIVE)
    assert str(caught.value).startswith("host h1: illegal transition stopping -> alive")
    assert host.state is HostState.STOPPING
    hosts.close()


def test_a_draining_or_stopping_host_takes_no_work_but_is_shown_alive() -> None:
    hosts, listener = registry()
    host = hosts.get("h1")
    assert (host.takes_work, host.alive, host.liveness) == (True, True, "alive")
    hosts.stopping("h1")
    assert host.state is HostState.ALIVE, "only a draining host can be stopping"
    host.move_to(HostState.DRAINING)
    assert (host.takes_work, host.alive, host.liveness) == (False, True, "alive")
    hosts.stopping("h1")
    assert host.state is HostState.STOPPING
    assert (host.takes_work, host.alive, host.liveness) == (False, True, "alive")

    hosts.check_liveness(now=10.0)  # silent: lost, whatever it was doing
    assert host.state is HostState.LOST
    assert (host.takes_work, host.alive, host.liveness) == (False, False, "lost")
    assert listener.lost == [("h1", HostState.LOST)]
    hosts.report("h1", REPORT, now=11.0)
    assert host.state is HostState.ALIVE
    hosts.close()


def test_a_forgotten_host_is_handled_as_lost_then_given_up_and_dropped() -> None:
    hosts, listener = registry()
    host = hosts.get("h1")
    host.move_to(HostState.DRAINING)
    hosts.stopping("h1")
    hosts.forget("h1")
    assert listener.lost == [("h1", HostState.LOST)]
    assert host.state is HostState.GIVEN_UP
    assert hosts.all() == []
    hosts.forget("h1")  # once
    assert listener.lost == [("h1", HostState.LOST)]
    hosts.report("h1", REPORT, now=20.0)  # a later report registers it anew
    assert hosts.get("h1").state is HostState.ALIVE
    assert listener.reports == [("h1", False), ("h1", False)]
    hosts.close()


def cell() -> Cell:
    message = ClientMessage("shell", "execute_request", "c1", [])
    return Cell(message, None, None, stop_on_error=True, received_at=0.0)


async def test_a_cell_ends_once_per_run_and_only_a_retry_is_sent_again() -> None:
    ran = cell()
    ran.end(CellOutcome.RETRY)
    assert await ran.ended is CellOutcome.RETRY
    ran.reopen()
    assert (ran.outcome, ran.ended.done()) == (CellOutcome.PENDING, False)
    ran.end(CellOutcome.OK)
    assert await ran.ended is CellOutcome.OK
    with pytest.raises(IllegalTransition) as caught:
        ran.end(CellOutcome.ERROR)
    assert str(caught.value).startswith("cell c1: illegal transition ok -> error")
    with pytest.raises(IllegalTransition, match="ok -> pending"):
        ran.reopen()
    assert ran.outcome is CellOutcome.OK

    waiting = cell()
    with pytest.raises(IllegalTransition, match="pending -> pending"):
        waiting.reopen()
    await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        ("ok", CellOutcome.OK),
        ("error", CellOutcome.ERROR),
        ("aborted", CellOutcome.ABORTED),
        ("retry", CellOutcome.RETRY),
        ("pending", CellOutcome.OK),  # not an end: a kernel's odd status ends as ok does
        ("odd", CellOutcome.OK),
    ],
)
def test_a_reply_status_is_an_outcome(status: str, outcome: CellOutcome) -> None:
    assert CellOutcome.of_reply(status) is outcome
