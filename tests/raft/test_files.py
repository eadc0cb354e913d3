"""`ReplicatedFiles`, the gateway group's state: three real pysyncobj nodes on real sockets,
in this process (the gateway group's own tests run them as separate gateway processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet.raft.errors import BindFailed, NotCommitted
from kernelfleet.raft.files import ReplicatedFiles
from kernelfleet.testing import free_port, wait_for

PASSWORD = "group-password-for-tests"


def start(addresses: list[str], i: int, root: Path) -> ReplicatedFiles:
    return ReplicatedFiles(addresses[i], addresses, password=PASSWORD, data_dir=root / f"node-{i}")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[list[str], list[ReplicatedFiles]]]:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = [start(addresses, i, tmp_path) for i in range(3)]
    try:
        yield addresses, nodes
    finally:
        for node in nodes:
            node.close()


def leader_of(nodes: list[ReplicatedFiles]) -> ReplicatedFiles:
    wait_for(lambda: sum(node.is_leader for node in nodes) == 1, 15, "one leader")
    return next(node for node in nodes if node.is_leader)


def test_a_write_on_the_leader_reaches_every_member_and_a_claim_names_the_server(group):
    _, nodes = group
    leader = leader_of(nodes)
    leader.write("kernels.json", b'{"kernels": []}')
    leader.write("kernels.json", b'{"kernels": [1]}')
    term = leader.claim("http://leader:8765")
    assert term == leader.term >= 1
    for node in nodes:
        wait_for(lambda n=node: n.serving == ("http://leader:8765", term), 10, "the claim")
        assert node.files() == {"kernels.json": b'{"kernels": [1]}'}


def test_a_follower_cannot_write(group):
    _, nodes = group
    leader = leader_of(nodes)
    follower = next(node for node in nodes if node is not leader)
    with pytest.raises(NotCommitted, match="NOT_LEADER"):
        follower.write("kernels.json", b"{}", timeout=2)
    assert leader.files() == {}


def test_a_write_of_an_older_term_than_the_last_claim_is_dropped(group):
    _, nodes = group
    leader = leader_of(nodes)
    term = leader.claim("http://leader:8765")
    stale = leader._files.put("kernels.json", b"stale", term - 1, sync=True, timeout=5)
    assert stale is False
    leader.write("kernels.json", b"current")
    assert leader.files() == {"kernels.json": b"current"}


def test_a_member_restarted_on_its_folder_keeps_the_files(group, tmp_path):
    addresses, nodes = group
    leader = leader_of(nodes)
    leader.write("jobs.json", b"[]")
    i = next(i for i, node in enumerate(nodes) if node is not leader)
    wait_for(lambda: nodes[i].files() == {"jobs.json": b"[]"}, 10, "the follower's copy")
    nodes[i].close()
    nodes[i] = start(addresses, i, tmp_path)
    wait_for(lambda: nodes[i].files() == {"jobs.json": b"[]"}, 15, "the restarted copy")


def test_a_node_with_another_password_is_not_heard(group, tmp_path):
    addresses, nodes = group
    leader_of(nodes)
    intruder_address = f"127.0.0.1:{free_port()}"
    intruder = ReplicatedFiles(
        intruder_address, addresses, password="not-the-password", data_dir=tmp_path / "x"
    )
    try:
        with pytest.raises(NotCommitted):
            intruder.write("kernels.json", b"forged", timeout=2)
        assert all(node.files() == {} for node in nodes)
    finally:
        intruder.close()


def test_a_taken_port_is_a_clear_error(group, tmp_path):
    addresses, _ = group
    with pytest.raises(BindFailed, match=addresses[0]):
        ReplicatedFiles(addresses[0], addresses, password=PASSWORD, data_dir=tmp_path / "y")
