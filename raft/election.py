"""Executor election for one cell, as NotebookOS decides it: pure functions, no I/O, no clock.

Every replica appends a `Proposal` (LEAD or YIELD) to the log. Each replica, on its own, calls
`decide` with the proposals committed so far (in commit order) whenever one commits and when
the deadline of a returned `Undecided` passes:

- a winner is chosen once every replica's proposal arrived, or once ``timeout`` seconds passed
  since the first LEAD committed (``first_lead_at``, the replica's own clock reading then);
- the winner is the previous executor if it proposed LEAD, else the first LEAD committed;
- if every replica proposed YIELD, the election fails (the gateway migrates and retries the cell
  as the next ``attempt``).

The replica then appends a `Vote` with its result. Replicas may decide differently (their
clocks differ), so only the log decides: `first_vote` reads the first committed vote.

Proposals are de-duplicated by replica: a replica's first committed proposal counts.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from kernelfleet.raft.entries import Entry, Proposal, Role, Vote


class FailureReason(enum.StrEnum):
    """Why an election produced no executor."""

    ALL_YIELD = "all-yield"
    """Every replica proposed YIELD."""
    VOTED_FAILED = "voted-failed"
    """The first committed vote records a failed election."""


@dataclass(frozen=True)
class Undecided:
    """No decision yet. `deadline`: when (same clock as ``now``) to decide again even if no
    proposal commits meanwhile; None while no LEAD has committed (nothing to wait for)."""

    deadline: float | None = None


@dataclass(frozen=True)
class Winner:
    """`replica_id` executes the cell."""

    replica_id: str


@dataclass(frozen=True)
class Failed:
    """The election failed; see `reason`."""

    reason: FailureReason


Decision: TypeAlias = Undecided | Winner | Failed


def proposals_of(entries: Iterable[Entry], cell_id: str, attempt: int = 0) -> list[Proposal]:
    """The proposals for (`cell_id`, `attempt`) among `entries`, in the order given."""
    return [
        entry
        for entry in entries
        if isinstance(entry, Proposal) and entry.cell_id == cell_id and entry.attempt == attempt
    ]


def _distinct(proposals: Sequence[Proposal]) -> list[Proposal]:
    """First proposal per replica, in commit order; all must be for one (cell, attempt)."""
    kept: dict[str, Proposal] = {}
    for proposal in proposals:
        if not isinstance(proposal, Proposal):
            raise TypeError(f"not a Proposal: {proposal!r}")
        first = proposals[0]
        if (proposal.cell_id, proposal.attempt) != (first.cell_id, first.attempt):
            raise ValueError(
                "proposals of different elections: "
                f"{(first.cell_id, first.attempt)} and {(proposal.cell_id, proposal.attempt)}"
            )
        kept.setdefault(proposal.replica_id, proposal)
    return list(kept.values())


def decide(
    proposals: Sequence[Proposal],
    *,
    previous_executor: str | None,
    replicas: int,
    first_lead_at: float | None,
    now: float,
    timeout: float,
) -> Decision:
    """Decide the executor of one election from its committed `proposals` (commit order).

    `previous_executor`: the replica that executed the kernel's previous cell (None if none).
    `replicas`: how many proposals make "all arrived". `first_lead_at`: when this replica saw
    the first LEAD commit (None if none has, or if unknown, e.g. for entries replayed from the
    journal: then only "all arrived" decides). `now`, `timeout`: seconds on the same clock.
    Raises ValueError for inconsistent input (a first_lead_at without any LEAD, proposals of
    several elections, replicas < 1, timeout < 0).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, not {replicas}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, not {timeout}")
    distinct = _distinct(proposals)
    leads = [proposal.replica_id for proposal in distinct if proposal.role is Role.LEAD]
    if first_lead_at is not None and not leads:
        raise ValueError("first_lead_at is set but no LEAD proposal is given")

    all_arrived = len(distinct) >= replicas
    deadline = None if first_lead_at is None else first_lead_at + timeout
    timed_out = deadline is not None and now >= deadline
    if not (all_arrived or timed_out):
        return Undecided(deadline=deadline)
    if not leads:
        return Failed(FailureReason.ALL_YIELD)
    if previous_executor is not None and previous_executor in leads:
        return Winner(previous_executor)
    return Winner(leads[0])


def vote_for(decision: Winner | Failed, proposal: Proposal, replica_id: str) -> Vote:
    """The `Vote` that `replica_id` appends for `decision` in `proposal`'s election."""
    winner = decision.replica_id if isinstance(decision, Winner) else None
    return Vote(
        cell_id=proposal.cell_id, replica_id=replica_id, winner=winner, attempt=proposal.attempt
    )


def first_vote(
    entries: Iterable[Entry], *, cell_id: str | None = None, attempt: int | None = None
) -> Decision:
    """The decision of the first committed `Vote` among `entries` (in commit order).

    Other kinds are skipped; `cell_id` / `attempt` (if given) select the election. Returns
    `Undecided()` while no vote has committed, `Winner` or `Failed(VOTED_FAILED)` after.
    Raises ValueError if no filter is given and votes of several elections are present.
    """
    first: Vote | None = None
    for entry in entries:
        if not isinstance(entry, Vote):
            continue
        if cell_id is not None and entry.cell_id != cell_id:
            continue
        if attempt is not None and entry.attempt != attempt:
            continue
        if first is None:
            first = entry
        elif (entry.cell_id, entry.attempt) != (first.cell_id, first.attempt):
            raise ValueError(
                "votes of different elections; pass cell_id and attempt to choose one: "
                f"{(first.cell_id, first.attempt)} and {(entry.cell_id, entry.attempt)}"
            )
    if first is None:
        return Undecided()
    if first.winner is None:
        return Failed(FailureReason.VOTED_FAILED)
    return Winner(first.winner)
