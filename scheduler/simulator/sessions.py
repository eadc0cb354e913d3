"""A simulated notebook session's life: an explicit state machine with a transition table."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kernelfleet.scheduler.simulator.cluster import SimKernel
from kernelfleet.scheduler.trace import Session
from kernelfleet.states import Transitions, check_transition


class SessionState(enum.Enum):
    NOT_STARTED = "not-started"
    ADMITTING = "admitting"  # its kernel waits for a placement
    ACTIVE = "active"  # its kernel has replicas (or needs none); cells run one at a time
    RECLAIMED = "reclaimed"  # idle past the timeout: its kernel is gone until its next cell
    ENDED = "ended"  # its kernel is gone, or it was rejected


TRANSITIONS: Transitions[SessionState] = {
    SessionState.NOT_STARTED: frozenset({SessionState.ADMITTING}),
    SessionState.ADMITTING: frozenset({SessionState.ACTIVE, SessionState.ENDED}),
    SessionState.ACTIVE: frozenset({SessionState.RECLAIMED, SessionState.ENDED}),
    SessionState.RECLAIMED: frozenset({SessionState.ADMITTING}),
    SessionState.ENDED: frozenset(),
}


@dataclass
class SimSession:
    """The engine's record of one trace session."""

    trace: Session
    kernel: SimKernel
    state: SessionState = SessionState.NOT_STARTED
    next_cell: int = 0  # index of the session's next cell
    next_submit: float = 0.0  # when that cell is (or was) submitted, shifted by past delays

    def move(self, to: SessionState) -> None:
        self.state = check_transition(TRANSITIONS, f"session {self.trace.id}", self.state, to)
