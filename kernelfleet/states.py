"""What every state machine of kernelfleet shares: a transition table and the error for a bad move.

Each record with a life (a gateway's replica, host or cell outcome; a host agent's replica; a
simulated session) keeps its state as an `enum.Enum` whose values are the strings its API
shows, and moves only along its table: every state maps to the states it may go to next.
`check_transition` is the one place that enforces it, in every process. This module imports
nothing from kernelfleet.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

S = TypeVar("S", bound=enum.Enum)

Transitions = Mapping[S, frozenset[S]]
"""State -> the states it may move to (a state missing from its own set cannot repeat)."""


class IllegalTransition(RuntimeError):
    """A record was asked to move to a state its current state does not lead to: a bug in
    kernelfleet, never a client's fault (so it is no `FleetError`, and HTTP shows it as a 500).

    ``record`` names the record ("replica 1a2b3c4d-9f8e7d of kernel ..."), ``state`` and
    ``attempted`` are the enum members."""

    reason = "illegal-transition"

    def __init__(self, record: str, state: enum.Enum, attempted: enum.Enum) -> None:
        super().__init__(
            f"{record}: illegal transition {state.value} -> {attempted.value} "
            f"(a {type(state).__name__} in state {state.value} cannot become {attempted.value})"
        )
        self.record = record
        self.state = state
        self.attempted = attempted


def check_transition(table: Transitions[S], record: str, state: S, attempted: S) -> S:
    """Return `attempted` if `table` lets `state` move there; else raise `IllegalTransition`."""
    if attempted not in table[state]:
        raise IllegalTransition(record, state, attempted)
    return attempted
