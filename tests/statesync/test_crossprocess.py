"""Replicas in separate processes: notebook code pickled by value works where it never ran.

The executor is this process; the follower is a fresh ``python`` with another string-hash
seed, which only sees the log entries (a file) and the shared store directory.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernelfleet.kernels.objectstore import LocalDirectoryStore
from kernelfleet.kernels.replica.statesync import EncodedDelta, apply, namespace_digest

from .conftest import Cluster

CELLS = [
    """\
import numpy as np
from collections import Counter
scale = 2
class Model:
    def __init__(self, w):
        self.w = w
    def predict(self, x):
        return helper(x) * self.w * scale
    @staticmethod
    def kind():
        return "linear"
    @property
    def double(self):
        return self.w * 2
def helper(x):
    return x + 1
square = lambda v: v * v
def make_counter():
    count = 0
    def inc():
        nonlocal count
        count += 1
        return count
    return inc
counter = make_counter()
counter()
""",
    "m = Model(3)\nweights = np.arange(200_000, dtype=np.float32)\ntags = {'a', 'b', 'c'}\n"
    "letters = Counter('hello')",
    "scale = 5\ndel square",
]

FOLLOWER = """
import json, pickle, sys
from kernelfleet.kernels.objectstore import LocalDirectoryStore
from kernelfleet.kernels.replica.statesync import (
    EncodedDelta, NamespaceTracker, apply, encode, namespace_digest,
)

root, entries_file = sys.argv[1], sys.argv[2]
store = LocalDirectoryStore(root)
ns = {"__name__": "__main__"}
tracker = NamespaceTracker(ns)
with open(entries_file, "rb") as f:
    entries = pickle.load(f)
for entry in entries:
    apply(EncodedDelta.from_dict(entry), ns, store, tracker=tracker)
result = {"digest": namespace_digest(ns, tracker), "resend": sorted(tracker.diff().changed)}
result |= {
    "predict": ns["m"].predict(1),
    "isinstance": isinstance(ns["m"], ns["Model"]),
    "kind": ns["Model"].kind(),
    "double": ns["m"].double,
    "counter": ns["counter"](),
    "square_deleted": "square" not in ns,
    "weights_sum": float(ns["weights"].sum()),
    "letters": dict(ns["letters"]),
}
# now this replica executes a cell, and its delta goes back to the first one
exec("m.w = 10\\nnew = Model(7)\\ndef triple(v):\\n    return 3 * v * scale", ns)
delta = tracker.diff()
encoded = encode(delta, store)
result["entry"] = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in encoded.changed.items()}
result["pointers"] = encoded.pointers
print(json.dumps(result))
"""


def test_notebook_definitions_work_in_another_process(tmp_path: Path, replicas: Any) -> None:
    cluster: Cluster = replicas(1)
    executor, tracker = cluster.namespaces[0], cluster.trackers[0]
    for cell in CELLS:
        cluster.run(0, cell)
    entries_file = tmp_path / "entries.pkl"
    entries_file.write_bytes(pickle.dumps(cluster.entries))
    assert isinstance(cluster.store, LocalDirectoryStore)
    env = {**os.environ, "PYTHONHASHSEED": "1"}
    done = subprocess.run(
        [sys.executable, "-c", FOLLOWER, str(cluster.store.root), str(entries_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["predict"] == 30  # helper(1) * 3 * scale, with the synced scale = 5
    assert result["isinstance"] is True
    assert result["kind"] == "linear"
    assert result["double"] == 6
    assert result["counter"] == 2  # closure state travelled: the executor had called it once
    assert result["square_deleted"] is True
    assert result["weights_sum"] == float(executor["weights"].sum())
    assert result["letters"] == dict(executor["letters"])
    assert result["digest"] == namespace_digest(executor, tracker)
    # The follower does not send back what it applied, except maybe sets: their pickle follows
    # the per-process string hash order, which may differ from the executor's.
    assert set(result["resend"]) <= {"tags"}

    back = EncodedDelta(
        changed={name: bytes.fromhex(data) for name, data in result["entry"].items()},
        pointers=result["pointers"],
    )
    # counter: the follower called it (closure state changed); tags: maybe, as noted above
    assert back.names() - {"tags"} == {"m", "new", "triple", "counter"}
    apply(back, executor, cluster.store, tracker=tracker)
    assert type(executor["new"]) is executor["Model"]  # a class this replica defined
    assert type(executor["m"]) is executor["Model"]
    assert executor["m"].predict(1) == 2 * 10 * 5
    assert executor["triple"](2) == 30
    assert executor["counter"]() == 3
