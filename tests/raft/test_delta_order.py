"""Which committed deltas take effect (`DeltaOrder`): every replica, and a replica replaying a
pruned log, must decide alike from the log alone; a late second copy of a delta, or one given
up on, would roll names back and lose ok cells' effects without a word (a chaos soak cutting
hosts' networks found 58 such cells)."""

from __future__ import annotations

from kernelfleet.raft.compaction import live_keys, prune
from kernelfleet.raft.entries import DeltaOrder, Proposal, Role, StateDelta

KEY = "{:064x}".format


def run(order: DeltaOrder, *steps: tuple) -> list[bool | None]:
    """Feed ``("lead", cell, replica[, attempt])`` and ``("delta", cell, replica, count)``
    steps at indexes 1, 2, ...; what each delta's `admit` said (None for a LEAD)."""
    said: list[bool | None] = []
    for index, step in enumerate(steps, start=1):
        if step[0] == "lead":
            attempt = step[3] if len(step) > 3 else 0
            order.lead(index, step[1], attempt, step[2])
            said.append(None)
        else:
            said.append(order.admit(step[1], step[2], step[3]))
    return said


def test_each_led_cell_s_delta_takes_effect_once_in_order():
    order = DeltaOrder()
    said = run(order, ("lead", "c1", "r0"), ("delta", "c1", "r0", 1),
               ("lead", "c2", "r0"), ("delta", "c2", "r0", 2))  # fmt: skip
    assert said == [None, True, None, True]
    assert order.completed == {"c1": 1, "c2": 2}
    assert order.owed == {}


def test_a_late_second_copy_of_a_delta_takes_no_effect():
    order = DeltaOrder()
    said = run(
        order,
        ("lead", "c1", "r0"), ("delta", "c1", "r0", 1),
        ("lead", "c2", "r1"), ("delta", "c2", "r1", 2),
        ("delta", "c1", "r0", 1),  # the retried append's first attempt, committed late
    )  # fmt: skip
    assert said[-1] is False
    assert order.completed == {"c1": 1, "c2": 2}


def test_a_copy_right_after_the_first_takes_no_effect_either():
    order = DeltaOrder()
    said = run(order, ("lead", "c1", "r0"), ("delta", "c1", "r0", 1), ("delta", "c1", "r0", 1))
    assert said == [None, True, False]


def test_a_delta_given_up_on_by_the_next_executor_never_lands_on_its_cell():
    order = DeltaOrder()
    said = run(
        order,
        ("lead", "c1", "r0"),  # r0 ran c1, then lost its group before publishing
        ("lead", "c2", "r1"),  # r1 waited for r0's delta, gave up, ran c2 without it
        ("delta", "c2", "r1", 1),
        ("delta", "c1", "r0", 1),  # r0's delta arrives after all
    )
    assert said == [None, None, True, False]
    assert "r0" not in order.owed


def test_a_delta_the_next_executor_waited_for_takes_effect():
    order = DeltaOrder()
    said = run(order, ("lead", "c1", "r0"), ("lead", "c2", "r1"), ("delta", "c1", "r0", 1),
               ("delta", "c2", "r1", 2))  # fmt: skip
    assert said == [None, None, True, True]


def test_a_replica_that_led_another_cell_owes_only_that_one():
    """Its earlier publish failed, so its next delta carries both cells' changes."""
    order = DeltaOrder()
    said = run(order, ("lead", "c1", "r0"), ("lead", "c2", "r0"), ("delta", "c1", "r0", 1),
               ("delta", "c2", "r0", 2))  # fmt: skip
    assert said == [None, None, False, True]


def test_a_rival_or_repeated_lead_owes_nothing():
    order = DeltaOrder()
    run(order, ("lead", "c1", "r0"), ("lead", "c1", "r1"), ("lead", "c1", "r0"))
    assert set(order.owed) == {"r0"}
    run(order, ("delta", "c1", "r0", 1), ("lead", "c1", "r2", 1))  # led again once it ran
    assert order.owed == {}


def test_a_delta_whose_lead_was_pruned_takes_effect_unless_its_count_went_back():
    order = DeltaOrder()
    assert run(order, ("delta", "c1", "r0", 1), ("delta", "c2", "r0", 2)) == [True, True]
    assert run(order, ("delta", "c0", "r0", 0)) == [False]
    assert run(order, ("delta", "c3", "r0", 2)) == [True]  # a silent cell keeps the count


def test_it_remembers_a_bounded_number_of_cells():
    order = DeltaOrder(remembered=3)
    for n in range(10):
        run(order, ("lead", f"c{n}", "r0"), ("delta", f"c{n}", "r0", n))
    assert list(order.completed) == ["c7", "c8", "c9"]
    assert len(order.leads) == len(order.first_leads) == 3


# ---- compaction keeps what replicas applied, and only that ----------------------------------


def lead(cell: str, replica: str = "r0") -> tuple:
    return Proposal(cell, replica, Role.LEAD).to_wire()


def test_a_pruned_log_drops_a_late_copy_so_a_late_joiner_builds_the_same_namespace():
    c1 = StateDelta("c1", "r0", changed={"x": b"1"}, pointers={"big": KEY(1)}, execution_count=1)
    c2 = StateDelta("c2", "r1", changed={"x": b"2"}, pointers={"big": KEY(2)}, execution_count=2)
    entries = list(enumerate([lead("c1"), c1.to_wire(), lead("c2", "r1"), c2.to_wire(),
                              c1.to_wire()]))  # fmt: skip
    kept = prune(entries, keep_recent=1)
    assert [wire[2]["cell_id"] for _, wire in kept if wire[0] == StateDelta.KIND] == ["c2"]
    assert live_keys(entries) == {KEY(2)}  # the copy's object is not what the namespace holds


def test_a_superseded_delta_among_the_newest_stays_as_a_stub_without_its_values():
    """So a replica joining from the pruned list learns which cells completed (and refuses a
    late copy as the others do) without receiving thousands of superseded values."""
    c1 = StateDelta("c1", "r0", changed={"x": b"1" * 1000}, execution_count=1)
    c2 = StateDelta("c2", "r0", changed={"x": b"2"}, execution_count=2)
    entries = list(enumerate([lead("c1"), c1.to_wire(), lead("c2"), c2.to_wire()]))
    kept = prune(entries, keep_recent=10)
    assert [index for index, _ in kept] == [0, 1, 2, 3]
    stub = StateDelta.from_wire(kept[1][1])
    assert (stub.cell_id, stub.replica_id, stub.execution_count) == ("c1", "r0", 1)
    assert stub.changed == {}
    assert kept[3][1] == c2.to_wire()
