"""NotebookOS executor election on literal inputs (REFERENCE §2)."""

from __future__ import annotations

import pytest

from kernelfleet.raft.election import (
    Failed,
    FailureReason,
    Undecided,
    Winner,
    decide,
    first_vote,
    proposals_of,
    vote_for,
)
from kernelfleet.raft.entries import Completion, CompletionStatus, Proposal, Role, StateDelta, Vote

TIMEOUT = 5.0


def lead(replica: str, cell: str = "c1", attempt: int = 0) -> Proposal:
    return Proposal(cell, replica, Role.LEAD, attempt)


def yld(replica: str, cell: str = "c1", attempt: int = 0) -> Proposal:
    return Proposal(cell, replica, Role.YIELD, attempt)


def run(proposals, previous=None, replicas=3, first_lead_at=None, now=0.0):
    return decide(
        proposals,
        previous_executor=previous,
        replicas=replicas,
        first_lead_at=first_lead_at,
        now=now,
        timeout=TIMEOUT,
    )


# -- all proposals arrived ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("proposals", "previous", "expected"),
    [
        # one LEAD: it wins
        ([yld("r0"), lead("r1"), yld("r2")], None, Winner("r1")),
        # several LEADs, no previous executor: the first committed LEAD
        ([lead("r2"), lead("r0"), lead("r1")], None, Winner("r2")),
        ([yld("r0"), lead("r1"), lead("r2")], None, Winner("r1")),
        # the previous executor proposed LEAD: it wins even if it committed last
        ([lead("r0"), lead("r1"), lead("r2")], "r2", Winner("r2")),
        ([yld("r0"), lead("r1"), lead("r2")], "r2", Winner("r2")),
        # the previous executor YIELDed: the first LEAD
        ([lead("r0"), lead("r1"), yld("r2")], "r2", Winner("r0")),
        # the previous executor is not a replica any more: the first LEAD
        ([lead("r1"), lead("r0"), yld("r2")], "r9", Winner("r1")),
        # all YIELD: the election fails
        ([yld("r0"), yld("r1"), yld("r2")], None, Failed(FailureReason.ALL_YIELD)),
        ([yld("r0"), yld("r1"), yld("r2")], "r1", Failed(FailureReason.ALL_YIELD)),
    ],
)
def test_all_arrived(proposals, previous, expected):
    first_lead_at = 10.0 if any(p.role is Role.LEAD for p in proposals) else None
    assert run(proposals, previous, first_lead_at=first_lead_at, now=10.5) == expected


def test_all_arrived_decides_before_the_timeout_and_without_a_clock_reading():
    assert run([lead("r0"), yld("r1"), yld("r2")], first_lead_at=10.0, now=10.0) == Winner("r0")
    # replayed from the journal: no first_lead_at known, all arrived still decides
    assert run([yld("r0"), lead("r1"), yld("r2")], first_lead_at=None, now=0.0) == Winner("r1")


# -- waiting -------------------------------------------------------------------------------------


def test_no_proposal_yet_is_undecided_without_a_deadline():
    assert run([]) == Undecided(deadline=None)


def test_only_yields_so_far_wait_without_a_deadline():
    assert run([yld("r0"), yld("r1")], now=1000.0) == Undecided(deadline=None)


def test_a_lead_starts_the_timer():
    assert run([lead("r0")], first_lead_at=10.0, now=10.0) == Undecided(deadline=15.0)
    assert run([yld("r1"), lead("r0")], first_lead_at=10.0, now=14.999) == Undecided(15.0)


# -- timeout after the first committed LEAD ------------------------------------------------------


@pytest.mark.parametrize(
    ("proposals", "previous", "expected"),
    [
        ([lead("r0")], None, Winner("r0")),
        ([yld("r2"), lead("r1")], None, Winner("r1")),
        ([lead("r1"), lead("r0")], None, Winner("r1")),
        # the previous executor's LEAD arrived in time: it wins
        ([lead("r1"), lead("r0")], "r0", Winner("r0")),
        # the previous executor has not proposed (its host may be busy): first LEAD
        ([lead("r1"), yld("r2")], "r0", Winner("r1")),
    ],
)
def test_timeout_after_first_lead(proposals, previous, expected):
    assert run(proposals, previous, first_lead_at=10.0, now=15.0) == expected
    assert run(proposals, previous, first_lead_at=10.0, now=99.0) == expected


def test_zero_timeout_decides_at_the_first_lead():
    decision = decide(
        [lead("r1")],
        previous_executor="r0",
        replicas=3,
        first_lead_at=3.0,
        now=3.0,
        timeout=0.0,
    )
    assert decision == Winner("r1")


# -- duplicates, replica counts, other elections ------------------------------------------------


def test_a_replicas_first_proposal_counts():
    # r0 YIELDed first; its later LEAD (a retried append) does not count, nor does it fill a slot
    proposals = [yld("r0"), lead("r0"), lead("r1")]
    assert run(proposals, first_lead_at=1.0, now=2.0) == Undecided(6.0)
    assert run([*proposals, yld("r2")], previous="r0", first_lead_at=1.0, now=2.0) == Winner("r1")


def test_duplicate_leads_do_not_complete_the_election():
    assert run([lead("r0"), lead("r0"), lead("r0")], first_lead_at=1.0, now=1.0) == Undecided(6.0)


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_replica_count_sets_all_arrived(replicas):
    proposals = [yld(f"r{i}") for i in range(replicas - 1)] + [lead(f"r{replicas - 1}")]
    assert run(proposals[:-1], replicas=replicas) == Undecided(None)
    assert run(proposals, replicas=replicas, first_lead_at=0.0, now=0.0) == Winner(
        f"r{replicas - 1}"
    )


def test_more_proposers_than_replicas_still_decides():
    # a replaced replica's proposal and its successor's both committed
    proposals = [yld("r0"), yld("r1"), lead("r3"), lead("r2")]
    assert run(proposals, first_lead_at=0.0, now=0.0) == Winner("r3")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 0}, "replicas"),
        ({"first_lead_at": 1.0}, "no LEAD"),
    ],
)
def test_inconsistent_input_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run([yld("r0")], **kwargs)


def test_negative_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout"):
        decide([], previous_executor=None, replicas=3, first_lead_at=None, now=0.0, timeout=-1.0)


def test_proposals_of_different_elections_are_refused():
    with pytest.raises(ValueError, match="different elections"):
        run([lead("r0"), lead("r1", cell="c2")], first_lead_at=0.0)
    with pytest.raises(ValueError, match="different elections"):
        run([lead("r0"), lead("r1", attempt=1)], first_lead_at=0.0)


def test_proposals_of_selects_one_election_in_log_order():
    log = [
        lead("r0", cell="c0"),
        yld("r1"),
        Vote("c0", "r0", "r0"),
        lead("r2"),
        lead("r0", attempt=1),
        StateDelta("c1", "r2"),
        yld("r0"),
    ]
    assert proposals_of(log, "c1") == [yld("r1"), lead("r2"), yld("r0")]
    assert proposals_of(log, "c1", attempt=1) == [lead("r0", attempt=1)]
    assert proposals_of(log, "c9") == []


# -- votes ---------------------------------------------------------------------------------------


def test_first_vote_decides():
    log = [
        lead("r0"),
        Vote("c1", "r2", winner="r0"),
        Vote("c1", "r1", winner="r1"),  # a later, different conclusion: ignored
        Vote("c1", "r0", winner=None),
    ]
    assert first_vote(log) == Winner("r0")


def test_first_vote_of_a_failed_election():
    log = [Vote("c1", "r1", winner=None), Vote("c1", "r0", winner="r0")]
    assert first_vote(log) == Failed(FailureReason.VOTED_FAILED)


def test_no_vote_yet_is_undecided():
    assert first_vote([]) == Undecided()
    assert first_vote([lead("r0"), Completion("c0", "r0", CompletionStatus.OK)]) == Undecided()


def test_first_vote_filters_by_cell_and_attempt():
    log = [
        Vote("c1", "r0", winner=None),
        Vote("c0", "r1", winner="r1"),
        Vote("c1", "r2", winner="r2", attempt=1),
    ]
    assert first_vote(log, cell_id="c0") == Winner("r1")
    assert first_vote(log, cell_id="c1", attempt=0) == Failed(FailureReason.VOTED_FAILED)
    assert first_vote(log, cell_id="c1", attempt=1) == Winner("r2")
    assert first_vote(log, cell_id="c2") == Undecided()
    with pytest.raises(ValueError, match="different elections"):
        first_vote(log)
    with pytest.raises(ValueError, match="different elections"):
        first_vote(log, cell_id="c1")


def test_vote_for_records_the_decision():
    proposal = lead("r0", attempt=2)
    assert vote_for(Winner("r0"), proposal, "r1") == Vote("c1", "r1", "r0", attempt=2)
    failed = vote_for(Failed(FailureReason.ALL_YIELD), proposal, "r2")
    assert failed == Vote("c1", "r2", None, attempt=2)
    assert first_vote([failed]) == Failed(FailureReason.VOTED_FAILED)


def test_a_whole_election_through_the_log():
    """Replicas may decide differently (their clocks differ); the first committed vote rules."""
    log: list = [yld("r0"), lead("r2")]
    # r2 saw lead("r2") commit at 100.0 and decides on timeout, before r1's LEAD arrived
    at_r2 = run(proposals_of(log, "c1"), "r1", first_lead_at=100.0, now=103.0)
    assert at_r2 == Undecided(105.0)
    at_r2 = run(proposals_of(log, "c1"), "r1", first_lead_at=100.0, now=105.0)
    assert at_r2 == Winner("r2")
    log.append(lead("r1"))
    # r1's own clock had not run out when its LEAD committed: all arrived, previous executor
    at_r1 = run(proposals_of(log, "c1"), "r1", first_lead_at=200.0, now=201.0)
    assert at_r1 == Winner("r1")
    log += [vote_for(at_r2, log[0], "r2"), vote_for(at_r1, log[0], "r1")]
    assert first_vote(log, cell_id="c1", attempt=0) == Winner("r2")
