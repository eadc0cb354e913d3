"""A kernel's Raft group as real pysyncobj nodes, one process each, on loopback ports."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest
from pysyncobj.utility import TcpUtility, UtilityException

from kernelfleet.raft.entries import Entry, Proposal, Role, StateDelta
from kernelfleet.testing import wait_for

from .conftest import PASSWORD, NodeFailed, NodeProcess, RaftCluster, free_port, wire

pytestmark = pytest.mark.timeout(60)


def proposals(tag: str, n: int) -> list[Entry]:
    return [Proposal(f"{tag}-{i}", "r0", Role.LEAD) for i in range(n)]


def assert_same_log(nodes: list[NodeProcess], count: int) -> list[Entry]:
    """Every node saw `count` entries, the same ones in the same order, on_commit once each."""
    logs = [node.entries() for node in nodes]
    assert len(logs[0]) == count
    for node, log in zip(nodes[1:], logs[1:], strict=True):
        assert log == logs[0], f"{node.address} differs"
    for node in nodes:
        assert node.commits() == list(range(count)), node.address
    return logs[0]


def test_three_nodes_elect_a_leader_and_commit(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    followers = [node for node in cluster.live if node is not leader]

    delta = StateDelta("cell-1", "r0", changed={"x": b"\x80\x04K\x01."}, execution_count=1)
    assert leader.append(Proposal("cell-1", "r0", Role.LEAD)) == 0
    assert followers[0].append(Proposal("cell-1", "r1", Role.YIELD)) == 1
    assert followers[1].append(delta) == 2
    assert leader.append(Proposal("cell-2", "r0", Role.LEAD)) == 3

    cluster.wait_applied(4, cluster.live)
    log = assert_same_log(cluster.live, 4)
    assert log[2] == delta
    assert {node.status()["term"] for node in cluster.live} == {leader.status()["term"]}


def test_concurrent_appends_arrive_in_one_order_everywhere(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    cluster.wait_leader()
    nodes = cluster.live
    requests = [
        (node, node.send("append_many", entries=[wire(e) for e in proposals(f"n{i}", 30)]))
        for i, node in enumerate(nodes)
    ]
    for node, request_id in requests:
        reply = node.reply(request_id)
        assert reply["ok"], reply
        assert reply["indices"] == sorted(reply["indices"])

    cluster.wait_applied(90, nodes)
    log = assert_same_log(nodes, 90)
    # each submitter's entries keep their relative order
    for i in range(3):
        cells = [entry.cell_id for entry in log if entry.cell_id.startswith(f"n{i}-")]
        assert cells == [f"n{i}-{k}" for k in range(30)]


def test_leader_killed_in_flight_append_fails_clearly_and_retry_commits(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    for entry in proposals("before", 3):
        leader.append(entry)
    survivors = [node for node in cluster.live if node is not leader]
    cluster.wait_applied(3, survivors)

    # The leader stops answering; a follower's append is forwarded to it and stays in flight.
    leader.signal(signal.SIGSTOP)
    entry = Proposal("in-flight", "r1", Role.LEAD)
    request_id = survivors[0].send("append", entry=wire(entry), timeout=10)
    killed_at = time.monotonic()
    leader.kill()

    reply = survivors[0].reply(request_id)
    assert not reply["ok"]
    assert reply["error"] == "NotCommitted"
    # LEADER_CHANGED when the follower forwarded it before noticing the silence (the usual
    # case); MISSING_LEADER if the election had already begun when it arrived.
    assert reply["reason"] in ("leader-changed", "missing-leader"), reply

    new_leader = cluster.wait_leader(survivors)
    reelected_after = time.monotonic() - killed_at
    assert new_leader is not leader
    assert reelected_after < 5.0

    index = survivors[0].call("append_retry", entry=wire(entry), timeout=10)["index"]
    assert index == 3
    cluster.wait_applied(4, survivors)
    log = assert_same_log(survivors, 4)
    assert log[3] == entry


def test_restarted_follower_and_group_recover_every_entry_from_disk(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    addresses = list(cluster.nodes)
    leader.call("append_many", entries=[wire(e) for e in proposals("a", 10)])
    follower = next(node for node in cluster.live if node is not leader)
    cluster.wait_applied(10, [follower])

    follower.kill()
    leader.call("append_many", entries=[wire(e) for e in proposals("b", 5)])
    restarted = cluster.spawn(follower.address, addresses)
    cluster.wait_applied(15, [restarted])
    assert_same_log(cluster.live, 15)

    # A full dump on one node, then the whole group dies and comes back from its data dirs.
    restarted.call("compact")
    wait_for(lambda: (restarted.data_dir / "raft.dump").exists(), 10, "a full dump")
    for node in cluster.live:
        node.kill()
    nodes = [cluster.spawn(address, addresses) for address in addresses]
    cluster.wait_leader(nodes)
    cluster.wait_applied(15, nodes)
    assert_same_log(nodes, 15)
    assert nodes[0].append(Proposal("after", "r0", Role.YIELD)) == 15


def test_membership_replace_a_dead_replica_and_catch_up(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    leader.call("append_many", entries=[wire(e) for e in proposals("a", 12)])
    dead = next(node for node in cluster.live if node is not leader)
    dead.kill()

    leader.call("remove_member", address=dead.address)
    newcomer_address = f"127.0.0.1:{free_port()}"
    members = leader.call("add_member", address=newcomer_address)["members"]
    assert dead.address not in members
    assert newcomer_address in members

    newcomer = cluster.spawn(newcomer_address, members)
    cluster.wait_applied(12, [newcomer])
    group = cluster.live
    assert newcomer in group
    assert newcomer.append(Proposal("from-newcomer", "r3", Role.YIELD)) == 12
    cluster.wait_applied(13, group)
    assert_same_log(group, 13)
    for node in group:
        assert sorted(node.status()["members"]) == sorted(members)


def test_wrong_password_never_joins_and_the_group_carries_on(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    term = leader.status()["term"]

    intruder_address = f"127.0.0.1:{free_port()}"
    members = leader.call("add_member", address=intruder_address)["members"]
    intruder = cluster.spawn(intruder_address, members, password=PASSWORD + "-wrong")

    # For a while, the group keeps committing and the intruder learns nothing.
    deadline = time.monotonic() + 1.5
    committed = 0
    while time.monotonic() < deadline:
        leader.append(Proposal(f"c{committed}", "r0", Role.LEAD))
        committed += 1
        status = intruder.status()
        assert status["leader"] is None
        assert status["applied"] == 0
        assert not status["is_ready"]
        time.sleep(0.05)
    group = [node for node in cluster.live if node is not intruder]
    cluster.wait_applied(committed, group)
    assert_same_log(group, committed)
    assert {node.status()["term"] for node in group} == {term}
    assert intruder.entries() == []

    leader.call("remove_member", address=intruder_address)


def test_oversized_entry_is_refused_before_reaching_pysyncobj(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    leader.append(Proposal("small", "r0", Role.LEAD))
    before = leader.status()

    huge = StateDelta("big", "r0", changed={"weights": b"\x00" * (300 * 1024)})
    with pytest.raises(NodeFailed) as failure:
        leader.append(huge)
    assert failure.value.reason == "entry-too-large"
    assert "object store" in failure.value.reply["message"]

    after = leader.status()
    assert after["raft_log_size"] == before["raft_log_size"]
    assert after["raft_commit_index"] == before["raft_commit_index"]
    assert leader.append(Proposal("small-again", "r0", Role.LEAD)) == 1


def test_a_follower_takes_the_leadership_and_the_log_is_unchanged(raft_cluster):
    """The executor of a kernel's cells asks for the leadership (`KernelLog.take_leadership`):
    its own appends then commit without the hop to another leader. The transfer is an
    election that changes nothing committed, and only a member with the password can ask."""
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    for entry in proposals("before", 5):
        leader.append(entry)
    follower = next(node for node in cluster.live if node is not leader)
    cluster.wait_applied(5, [follower])
    term = leader.status()["term"]

    stranger = TcpUtility(PASSWORD + "-wrong", timeout=1.0)
    with contextlib.suppress(UtilityException):
        stranger.executeCommand(leader.address, ["transfer", follower.address])
    time.sleep(0.6)  # past an election timeout: a transfer would have happened by now
    still = leader.status()
    assert still["is_leader"]
    assert still["term"] == term

    assert follower.call("take_leadership")["agreed"] is True
    wait_for(  # the old leader may still be the one all name for a moment
        lambda: follower.status()["is_leader"] and cluster.wait_leader() is follower,
        10,
        "the follower to lead",
    )
    assert follower.status()["term"] > term
    assert follower.call("take_leadership")["agreed"] is True  # it leads: nothing to ask

    assert follower.append(Proposal("after", "r1", Role.LEAD)) == 5
    cluster.wait_applied(6, cluster.live)
    log = assert_same_log(cluster.live, 6)
    assert log[:5] == proposals("before", 5)
