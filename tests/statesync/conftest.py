"""Fixtures for state-sync tests: replicas simulated as plain dicts, one real object store.

``replicas(n=2)`` builds n namespaces the way IPython does (``__name__ == "__main__"``, a few
names present at start and hidden), each with its own `NamespaceTracker`. ``cluster.run(i, code)``
executes a cell on replica i (``exec`` in its namespace, as IPython does) and syncs the delta to
every other replica through `encode`/`apply` and the store, as the kernel will over Raft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.kernels.objectstore import LocalDirectoryStore, ObjectStore
from kernelfleet.kernels.replica.statesync import (
    ApplyReport,
    EncodedDelta,
    NamespaceTracker,
    apply,
    encode,
    namespace_digest,
)


def ipython_like_namespace() -> dict[str, Any]:
    """A fresh user namespace with what IPython puts there before the first cell."""
    return {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "In": [""],
        "Out": {},
        "_ih": [""],
        "_oh": {},
        "_dh": ["/"],
        "get_ipython": lambda: None,
        "exit": object(),
        "quit": object(),
        "startup_helper": "defined by a startup file",
    }


@dataclass
class Cluster:
    """n replicas of one kernel sharing `store`; `entries` is the simulated log."""

    store: ObjectStore
    namespaces: list[dict[str, Any]]
    trackers: list[NamespaceTracker]
    entries: list[dict[str, Any]] = field(default_factory=list)
    reports: list[list[ApplyReport]] = field(default_factory=list)

    def run(self, executor: int, code: str, **encode_options: Any) -> EncodedDelta:
        """Execute `code` on replica `executor`, publish its delta, apply it everywhere else."""
        exec(code, self.namespaces[executor])
        return self.sync(executor, **encode_options)

    def sync(self, executor: int, **encode_options: Any) -> EncodedDelta:
        tracker = self.trackers[executor]
        delta = tracker.diff()
        encoded = encode(delta, self.store, **encode_options)
        entry = encoded.to_dict()  # what the log carries
        self.entries.append(entry)
        tracker.commit(delta, encoded)
        reports = []
        for i, namespace in enumerate(self.namespaces):
            if i != executor:
                received = EncodedDelta.from_dict(entry)
                reports.append(apply(received, namespace, self.store, tracker=self.trackers[i]))
        self.reports.append(reports)
        return encoded

    def digests(self) -> list[str]:
        return [
            namespace_digest(ns, t) for ns, t in zip(self.namespaces, self.trackers, strict=True)
        ]


@pytest.fixture
def store(tmp_path: Path) -> LocalDirectoryStore:
    return LocalDirectoryStore(tmp_path / "store")


@pytest.fixture
def replicas(store: LocalDirectoryStore) -> Callable[..., Cluster]:
    def make(n: int = 2) -> Cluster:
        namespaces = [ipython_like_namespace() for _ in range(n)]
        trackers = [NamespaceTracker(ns) for ns in namespaces]
        return Cluster(store, namespaces, trackers)

    return make
