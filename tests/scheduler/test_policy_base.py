"""The `Policy` base class defaults, and the simulator's session state machine."""

from __future__ import annotations

import pytest

from kernelfleet.errors import NoCapacity
from kernelfleet.scheduler import (
    ExecuteRequest,
    FleetSnapshot,
    Hold,
    HostSnapshot,
    KernelSnapshot,
    Placement,
    PlacementRequest,
    Policy,
    Queue,
    QueueReason,
    RunOn,
)
from kernelfleet.scheduler.simulator.cluster import SimKernel
from kernelfleet.scheduler.simulator.sessions import SessionState, SimSession
from kernelfleet.scheduler.trace import Session, TraceEvent
from kernelfleet.states import IllegalTransition


class FirstHost(Policy):
    """A policy that only implements `place`, as third-party ones written before may."""

    name = "first-host"

    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        alive = snapshot.alive_hosts()
        if not alive:
            raise NoCapacity("no host")
        return Placement((alive[0].id,))


def test_defaults_wrap_place_and_hold() -> None:
    policy = FirstHost()
    empty = FleetSnapshot(hosts=())
    decision = policy.admit(empty, PlacementRequest("k"))
    assert decision == Queue(QueueReason.WAITING_FOR_HOSTS, "no host")
    snapshot = FleetSnapshot(hosts=(HostSnapshot("a", 2, gpus_committed=2), HostSnapshot("b", 2)))
    assert policy.admit(snapshot, PlacementRequest("k")) == Placement(("a",))
    kernel = KernelSnapshot("k", 1, ("a", "b"), executor_host="a")
    assert policy.choose_executor(snapshot, ExecuteRequest(kernel, 1)) == RunOn("b")
    assert policy.choose_executor(snapshot, ExecuteRequest(kernel, 3)) == Queue(
        QueueReason.WAITING_FOR_GPUS
    )
    assert policy.autoscale(snapshot) == Hold()


def test_session_transitions_follow_the_table() -> None:
    event = TraceEvent(2, "0", 1, 0.0, 1.0)
    session = SimSession(Session(0, 1, (event,)), SimKernel("k0", 1))
    session.move(SessionState.ADMITTING)
    session.move(SessionState.ACTIVE)
    session.move(SessionState.RECLAIMED)
    with pytest.raises(IllegalTransition, match="reclaimed -> active"):
        session.move(SessionState.ACTIVE)
    session.move(SessionState.ADMITTING)
    session.move(SessionState.ENDED)
    with pytest.raises(IllegalTransition):
        session.move(SessionState.ADMITTING)
