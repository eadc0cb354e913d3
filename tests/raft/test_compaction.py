"""Log compaction: the group prunes superseded entries, pysyncobj dumps the pruned list, and a
replica that joins a kernel that ran many cells catches up from that snapshot instead of
replaying every cell."""

from __future__ import annotations

import pickle

import pytest

from kernelfleet.raft.compaction import live_keys, prune, referenced_keys
from kernelfleet.raft.entries import Proposal, Role, StateDelta
from kernelfleet.testing import wait_for

from .conftest import RaftCluster, free_port, wire

KEY = "{:064x}".format


def delta(cell: int, **fields) -> StateDelta:
    return StateDelta(f"c{cell}", "r0", execution_count=cell, **fields)


def indexed(*entries) -> list:
    return [(index, entry.to_wire()) for index, entry in enumerate(entries)]


def kept_cells(entries) -> list[str]:
    return [wire[2]["cell_id"] for _, wire in entries]


def test_a_delta_whose_every_name_was_set_again_is_dropped():
    entries = indexed(
        delta(1, changed={"x": b"1", "y": b"1"}),
        delta(2, changed={"x": b"2"}),
        delta(3, pointers={"x": KEY(3)}),
        delta(4, changed={"y": b"4"}),
        delta(5),  # the newest stays: it carries the execution count
    )
    assert kept_cells(prune(entries, keep_recent=1)) == ["c3", "c4", "c5"]


def test_a_group_frame_stays_while_one_of_its_names_has_no_later_value():
    entries = indexed(
        delta(1, pointers={"net,opt": KEY(1)}),
        delta(2, pointers={"net": KEY(2)}),
        delta(3, deleted=("gone",), imports={"np": "numpy"}),
    )
    assert kept_cells(prune(entries, keep_recent=1)) == ["c1", "c2", "c3"]
    assert live_keys(entries) == {KEY(1), KEY(2)}
    entries.append((3, delta(4, changed={"opt": b"4"}).to_wire()))
    assert kept_cells(prune(entries, keep_recent=1)) == ["c2", "c3", "c4"]
    assert live_keys(entries) == {KEY(2)}
    assert referenced_keys(entries) == {KEY(1), KEY(2)}


def test_deletions_imports_and_drops_supersede_like_values():
    entries = indexed(
        delta(1, pointers={"a": KEY(1)}, changed={"b": b"1", "c": b"1"}),
        delta(2, deleted=("a",), imports={"b": "math"}, problems={"c": "a lock"}),
        delta(3),
    )
    assert kept_cells(prune(entries, keep_recent=1)) == ["c2", "c3"]
    assert live_keys(entries) == set()


def test_only_recent_proposals_stay_and_unknown_kinds_are_kept():
    entries = [
        (0, Proposal("c0", "r9", Role.LEAD).to_wire()),
        (1, ("from-the-future", 1, {})),
        (2, delta(2, changed={"x": b"2"}).to_wire()),
        (3, Proposal("c3", "r0", Role.LEAD).to_wire()),
        (4, Proposal("c4", "r0", Role.LEAD).to_wire()),
    ]
    assert [index for index, _ in prune(entries, keep_recent=2)] == [1, 2, 3, 4]
    assert [index for index, _ in prune(entries, keep_recent=1)] == [1, 2, 4]


CELLS = 300
SMALL_LOG = {
    "KERNELFLEET_RAFT_PRUNE_MIN_ENTRIES": "40",
    "KERNELFLEET_RAFT_KEEP_RECENT_ENTRIES": "6",
    "KERNELFLEET_RAFT_COMPACTION_MIN_ENTRIES": "50",
    "KERNELFLEET_RAFT_COMPACTION_MIN_TIME": "3600",
}


def cell(n: int) -> list:
    """What one cell writes: its LEAD, then a delta overwriting `x` and `big`; every tenth
    cell also sets a name of its own."""
    changed = {"x": pickle.dumps(n)}
    if n % 10 == 0:
        changed[f"v{n}"] = pickle.dumps(n)
    written = StateDelta(
        f"c{n}", "r0", changed=changed, pointers={"big": KEY(n)}, execution_count=n
    )
    return [wire(Proposal(f"c{n}", "r0", Role.LEAD)), wire(written)]


@pytest.mark.timeout(120)
def test_a_replacement_catches_up_from_a_snapshot_not_from_every_cell(raft_cluster, monkeypatch):
    for name, value in SMALL_LOG.items():
        monkeypatch.setenv(name, value)  # the node processes inherit it
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    for start in range(0, CELLS, 50):
        batch = [w for n in range(start, start + 50) for w in cell(n)]
        leader.call("append_many", entries=batch, timeout=30)
    total = 2 * CELLS
    cluster.wait_applied(total, cluster.live, timeout=30)
    dead = next(node for node in cluster.live if node is not leader)
    dead.kill()

    leader.call("remove_member", address=dead.address)
    newcomer_address = f"127.0.0.1:{free_port()}"
    members = leader.call("add_member", address=newcomer_address)["members"]
    newcomer = cluster.spawn(newcomer_address, members)
    cluster.wait_applied(total, [newcomer], timeout=30)

    status = leader.status()
    assert status["raft_log_size"] < 60, "pysyncobj compacted its log into a dump"
    commits = newcomer.commits()
    # at most: the dump, and what the leader's raft log held since it (up to 50 raft entries,
    # and some in flight). The dump holds the list as the last prune left it (the 31 deltas that
    # still set something and the 6 newest entries: 37) plus what came since; the next prune
    # waits for twice as many as the last one kept, so up to 74. 74 + 50 + in flight < 150.
    assert len(commits) < 150, f"the newcomer replayed {len(commits)} of {total} entries"
    assert commits[-1] == total - 1
    # what it got rebuilds the same state: the last x and big, and every v<n>
    state: dict[str, object] = {}
    for entry in newcomer.entries():
        if isinstance(entry, StateDelta):
            state.update({k: pickle.loads(v) for k, v in entry.changed.items()})
            state.update(entry.pointers)
            count = entry.execution_count
    assert state["x"] == CELLS - 1
    assert state["big"] == KEY(CELLS - 1)
    assert {k for k in state if k.startswith("v")} == {f"v{n}" for n in range(0, CELLS, 10)}
    assert count == CELLS - 1
    # and the group goes on, the newcomer included
    assert newcomer.append(Proposal("after", "r3", Role.YIELD)) == total
    wait_for(lambda: all(n.status()["applied"] > total for n in cluster.live), 10, "apply")
