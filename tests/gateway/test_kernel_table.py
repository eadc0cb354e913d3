"""KernelTable: the kernels by id, and their durable copy."""

from __future__ import annotations

import pytest

from kernelfleet.errors import NotFound
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord, ReplicaState
from kernelfleet.gateway.store import KernelStore

NOWHERE = ConnectionInfo("127.0.0.1", 1, 2, 3, 4, 5, "key")


def kernel(kernel_id: str, *states: tuple[str, ReplicaState]) -> KernelRecord:
    replicas = [
        ReplicaRecord(f"{kernel_id}-{host}", host, NOWHERE, state=state) for host, state in states
    ]
    return KernelRecord(kernel_id, "python3", {}, replicas=replicas)


def test_kernels_are_found_listed_and_removed() -> None:
    table = KernelTable()
    first = kernel("k1", ("h1", ReplicaState.READY), ("h2", ReplicaState.DEAD))
    table.add(first)
    table.add(kernel("k2", ("h1", ReplicaState.CATCHING_UP)))
    assert table.get("k1") is first
    assert table.ids() == ["k1", "k2"]
    assert [(k.id, r.id) for k, r in table.live_replicas_on("h1")] == [
        ("k1", "k1-h1"), ("k2", "k2-h1"),
    ]  # fmt: skip
    assert table.live_replicas_on("h2") == [], "dead replicas are not on any host"
    assert table.is_current(first)
    assert table.pop("k1") is first
    assert table.pop("k1") is None
    assert not table.is_current(first)
    with pytest.raises(NotFound, match="no kernel with id 'k1'"):
        table.get("k1")
    assert table.stored() == [], "no store: nothing to recover"


def test_persisted_kernels_come_back_with_their_replica_states(tmp_path) -> None:
    table = KernelTable(KernelStore(tmp_path))
    table.add(kernel("k1", ("h1", ReplicaState.READY), ("h2", ReplicaState.CATCHING_UP)))
    table.persist()
    stored = KernelTable(KernelStore(tmp_path)).stored()
    assert [k.id for k in stored] == ["k1"]
    assert [r.state for r in stored[0].replicas] == [ReplicaState.READY, ReplicaState.CATCHING_UP]
