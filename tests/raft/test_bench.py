"""Commit latency of a 3-process group (run with ``-m benchmark -s`` to see the figures).

``raw``: pysyncobj's callback on a plain thread (the Raft round trip alone). ``async``:
`KernelLog.append` awaited on the node's loop (adds encoding, the size check and two hops
between the tick thread and the loop). Entries are 100 bytes serialized, sent one at a time.
"""

from __future__ import annotations

import pytest

from .conftest import RaftCluster

N = 400
SIZE = 100


@pytest.mark.benchmark
@pytest.mark.timeout(120)
def test_commit_latency_100_byte_entries(raft_cluster):
    cluster: RaftCluster = raft_cluster(3)
    leader = cluster.wait_leader()
    follower = next(node for node in cluster.live if node is not leader)
    rows = []
    for where, node in (("leader", leader), ("follower", follower)):
        for mode in ("raw", "async"):
            node.call("bench", n=20, size=SIZE, mode=mode)  # warm-up
            figures = node.call("bench", n=N, size=SIZE, mode=mode, timeout=60)
            rows.append((where, mode, figures))

    print(f"\ncommit latency, {SIZE} B entries, 3 processes, sequential, n={N} (ms)")
    print(f"{'submitter':<10}{'path':<7}{'p50':>8}{'p99':>8}{'max':>8}")
    for where, mode, figures in rows:
        print(
            f"{where:<10}{mode:<7}{figures['p50']:>8.2f}{figures['p99']:>8.2f}"
            f"{figures['max']:>8.2f}"
        )
    for _, _, figures in rows:
        assert figures["size"] >= SIZE
