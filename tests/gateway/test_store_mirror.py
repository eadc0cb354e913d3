"""`mirror_writes`: a replicated gateway's state writes are committed to its group first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet.gateway.store import (
    KernelStore,
    mirror_writes,
    stop_mirroring,
    write_json_atomically,
)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[list[tuple[str, bytes]]]:
    committed: list[tuple[str, bytes]] = []
    mirror_writes(tmp_path, lambda name, data: committed.append((name, data)))
    try:
        yield committed
    finally:
        stop_mirroring()


def test_a_write_under_the_folder_is_committed_first_by_its_relative_name(tmp_path, replicated):
    KernelStore(tmp_path).save([{"id": "k1"}])
    write_json_atomically(tmp_path / "autoscaled" / "hosts.json", {"hosts": []})
    assert [name for name, _ in replicated] == ["kernels.json", "autoscaled/hosts.json"]
    assert replicated[0][1] == (tmp_path / "kernels.json").read_bytes()
    assert KernelStore(tmp_path).load() == [{"id": "k1"}]


def test_a_write_elsewhere_is_not_replicated(tmp_path, replicated):
    write_json_atomically(tmp_path.parent / "elsewhere.json", {})
    assert replicated == []


def test_a_write_that_does_not_commit_leaves_the_file_as_it_was(tmp_path):
    KernelStore(tmp_path).save([{"id": "kept"}])

    def refuse(name: str, data: bytes) -> None:
        raise RuntimeError("no majority")

    mirror_writes(tmp_path, refuse)
    try:
        with pytest.raises(RuntimeError):
            KernelStore(tmp_path).save([{"id": "lost"}])
    finally:
        stop_mirroring()
    assert KernelStore(tmp_path).load() == [{"id": "kept"}]
