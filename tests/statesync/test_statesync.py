"""State sync on plain dicts: what changes, what travels where, what arrives."""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.objectstore import LocalDirectoryStore
from kernelfleet.kernels.replica.statesync import (
    INLINE_BUDGET,
    INLINE_LIMIT,
    ApplyFailed,
    EncodedDelta,
    NamespaceTracker,
    apply,
    encode,
    namespace_digest,
)
from kernelfleet.kernels.replica.statesync_pickling import serialize

from .conftest import Cluster

Replicas = Callable[..., Cluster]
MiB = 1024 * 1024


def test_plain_values_sync_and_digests_agree(replicas: Replicas) -> None:
    cluster = replicas(3)
    sent = cluster.run(
        0, "n = 42\ns = 'text'\nd = {'k': [1, 2.5, None], 't': (1, 'a')}\nst = {'x', 'y'}"
    )
    assert set(sent.changed) == {"n", "s", "d", "st"}
    assert not sent.pointers
    for follower in cluster.namespaces[1:]:
        assert follower["n"] == 42
        assert follower["s"] == "text"
        assert follower["st"] == {"x", "y"}
        assert follower["d"] == {"k": [1, 2.5, None], "t": (1, "a")}
    assert len(set(cluster.digests())) == 1
    cluster.namespaces[2]["d"]["k"].append("diverged")
    assert len(set(cluster.digests())) == 2


def test_only_changes_travel(replicas: Replicas) -> None:
    cluster = replicas()
    cluster.run(0, "a = 1\nb = [1, 2]\nc = 'same'")
    assert not cluster.run(0, "a = 1\nc = 'sa' + 'me'")  # equal content: nothing to send
    sent = cluster.run(0, "b.append(3)")  # mutated in place, same object
    assert set(sent.changed) == {"b"}
    assert cluster.namespaces[1]["b"] == [1, 2, 3]
    cluster.run(0, "cut = slice([1], None)")
    sent = cluster.run(0, "cut.start.append(2)")  # a slice may hold a mutable object
    assert set(sent.changed) == {"cut"}
    assert cluster.namespaces[1]["cut"].start == [1, 2]


def test_ipython_names_and_startup_names_are_not_synced(replicas: Replicas) -> None:
    cluster = replicas()
    code = "_ = 1\n__ = 2\n___ = 3\n_i = 'x'\n_ii = 'x'\n_i7 = 'x'\n_7 = 5\n__doc__ = 'd'\nmine = 1"
    sent = cluster.run(0, code)
    assert set(sent.changed) == {"mine"}
    follower = cluster.namespaces[1]
    assert "_7" not in follower
    assert "_i7" not in follower
    assert follower["In"] is not cluster.namespaces[0]["In"]
    rebound = cluster.run(0, "startup_helper = 'mine now'\nIn = 'ignored always'")
    assert set(rebound.changed) == {"startup_helper"}
    assert follower["startup_helper"] == "mine now"


def test_hidden_names_can_come_from_ipython_user_ns_hidden() -> None:
    namespace = {"helper": 1, "other": 2}
    tracker = NamespaceTracker(namespace, hidden={"helper": 1})
    assert {name for name, _ in tracker.tracked_items()} == {"other"}
    assert {n for n, _ in NamespaceTracker(namespace, hidden=["other"]).tracked_items()} == {
        "helper"
    }


def test_deletion_syncs(replicas: Replicas) -> None:
    cluster = replicas(3)
    cluster.run(0, "x = 1\ny = [2]\nimport json")
    sent = cluster.run(0, "del x, json")
    assert set(sent.deleted) == {"x", "json"}
    assert all("x" not in ns and "json" not in ns for ns in cluster.namespaces[1:])
    assert all(ns["y"] == [2] for ns in cluster.namespaces[1:])
    assert not cluster.run(0, "pass")


def test_imports_sync_by_module_name(replicas: Replicas) -> None:
    import json
    import os.path
    import xml.etree.ElementTree

    cluster = replicas()
    sent = cluster.run(
        0, "import json as j\nfrom os import path\nimport xml.etree.ElementTree as ET"
    )
    assert sent.imports == {"j": "json", "path": os.path.__name__, "ET": "xml.etree.ElementTree"}
    assert not sent.changed
    follower = cluster.namespaces[1]
    assert follower["j"] is json
    assert follower["path"] is os.path
    assert follower["ET"] is xml.etree.ElementTree
    assert len(set(cluster.digests())) == 1
    rebound = cluster.run(0, "j = 'no longer a module'")
    assert rebound.changed.keys() == {"j"}
    assert follower["j"] == "no longer a module"


def test_notebook_functions_see_the_followers_namespace(replicas: Replicas) -> None:
    cluster = replicas()
    cluster.run(0, "x = 2\ndef double():\n    return x * 2\ndef bump():\n    global x\n    x += 1")
    follower = cluster.namespaces[1]
    assert follower["double"]() == 4
    cluster.run(0, "x = 10")
    assert follower["double"]() == 20  # reads the follower's current x, not a snapshot
    follower["bump"]()
    assert follower["x"] == 11  # `global x` writes the follower's namespace
    assert follower["double"].__globals__ is follower


def test_notebook_class_and_its_instances_sync_across_cells(replicas: Replicas) -> None:
    cluster = replicas()
    cluster.run(
        0,
        "class Point:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "    def norm(self):\n"
        "        return abs(self.x) * scale",
    )
    cluster.run(0, "scale = 3\np = Point(-2)")
    follower = cluster.namespaces[1]
    assert type(follower["p"]) is follower["Point"]
    assert follower["p"].norm() == 6
    assert follower["Point"] is not cluster.namespaces[0]["Point"]
    assert not cluster.run(0, "pass")  # pickling an instance must not make its class "changed"
    cluster.run(0, "q = Point(5)")
    assert type(follower["q"]) is type(follower["p"])
    assert len(set(cluster.digests())) == 1


def test_any_replica_can_execute_next_without_resending(replicas: Replicas) -> None:
    cluster = replicas(3)
    cluster.run(
        0,
        "import numpy as np\nbig = np.arange(300_000)\nsmall = {'a': 1}\n"
        "def f():\n    return small['a']",
    )
    for tracker in cluster.trackers[1:]:
        assert not tracker.diff()  # what a follower applied is its baseline
    sent = cluster.run(2, "small['a'] = f() + 1\nbig[0] = -1")
    assert set(sent.changed) | set(sent.pointers) == {"small", "big"}
    assert cluster.namespaces[0]["small"] == {"a": 2}
    assert cluster.namespaces[1]["big"][0] == -1
    assert len(set(cluster.digests())) == 1


def test_unpicklable_values_are_reported_once_and_the_rest_syncs(
    replicas: Replicas, tmp_path: Path
) -> None:
    cluster = replicas()
    (tmp_path / "data.txt").write_text("x")
    cluster.run(0, "handle = 'will become a file'")
    code = (
        f"import threading\nhandle = open({str(tmp_path / 'data.txt')!r})\n"
        "lock = threading.Lock()\ngen = (i for i in range(3))\nok = 1"
    )
    sent = cluster.run(0, code)
    try:
        assert set(sent.problems) == {"handle", "lock", "gen"}
        assert "TextIOWrapper" in sent.problems["handle"]
        assert "lock" in sent.problems["lock"]
        assert "generator" in sent.problems["gen"]
        follower = cluster.namespaces[1]
        assert follower["ok"] == 1
        assert "handle" not in follower  # the stale string is dropped, not kept
        assert set(cluster.trackers[0].problems) == {"handle", "lock", "gen"}
        assert not cluster.run(0, "ok2 = 2").problems  # reported once, not every cell
        again = cluster.run(0, "lock = threading.Lock()")  # rebound: a new problem
        assert set(again.problems) == {"lock"}
        fixed = cluster.run(0, "gen = list(gen)")
        assert fixed.changed.keys() == {"gen"}
        assert follower["gen"] == [0, 1, 2]
        assert len(set(cluster.digests())) == 1  # unpicklable names are outside the digest
    finally:
        cluster.namespaces[0]["handle"].close()


def test_large_values_go_through_the_store(replicas: Replicas, store: LocalDirectoryStore) -> None:
    cluster = replicas()
    sent = cluster.run(0, "import numpy as np\nbig = np.zeros(200_000)\nsmall = np.ones(10)")
    assert set(sent.pointers) == {"big"}
    assert "small" in sent.changed
    first_key = sent.pointers["big"]
    assert store.has(first_key)
    follower = cluster.namespaces[1]
    assert np.array_equal(follower["big"], np.zeros(200_000))
    assert follower["big"].flags.writeable
    assert follower["small"].flags.writeable

    assert not cluster.run(0, "unchanged = 1").pointers  # unchanged large value: no new object
    assert set(store.keys()) == {first_key}

    rebound = cluster.run(0, "big = np.full(200_000, 7.0)")
    assert rebound.pointers["big"] != first_key
    assert np.array_equal(follower["big"], np.full(200_000, 7.0))

    in_place = cluster.run(0, "big += 1")
    assert set(in_place.pointers) == {"big"}
    assert follower["big"][0] == 8.0
    assert len(set(cluster.digests())) == 1


def test_a_delta_stays_small_enough_for_one_log_entry(replicas: Replicas) -> None:
    cluster = replicas()
    values = "\n".join(f"v{i} = bytes(range(256)) * 200" for i in range(12))  # 12 x ~51 KB
    sent = cluster.run(0, values + f"\nhuge = b'x' * {INLINE_LIMIT + 1}")
    assert sent.inline_bytes() <= INLINE_BUDGET
    assert "huge" in sent.pointers
    assert sent.pointers.keys() | sent.changed.keys() == {f"v{i}" for i in range(12)} | {"huge"}
    assert 0 < len(sent.changed) < 12  # some of the 51 KB values inline, the rest spilled
    assert len(pickle.dumps(sent.to_dict())) < 256 * 1024
    assert all(cluster.namespaces[1][f"v{i}"] == bytes(range(256)) * 200 for i in range(12))


def test_a_delta_of_thousands_of_names_stays_within_one_log_entry(replicas: Replicas) -> None:
    cluster = replicas(3)
    sent = cluster.run(0, "for i in range(3000):\n    globals()[f'value_{i:04d}'] = [i] * 8")
    assert len(sent.names()) == 3001  # and i
    assert len(pickle.dumps(sent.to_dict())) < 256 * 1024
    assert not sent.digests  # left out: they alone would take half the entry
    assert cluster.namespaces[2]["value_2999"] == [2999] * 8
    few = cluster.run(1, "value_0001.append(0)")
    assert set(few.digests) == {"value_0001"}
    assert not cluster.trackers[2].diff()  # what replica 2 applied with a digest is its baseline


def test_a_100_mb_array_is_stored_without_copies_and_arrives_equal(
    replicas: Replicas, store: LocalDirectoryStore
) -> None:
    cluster = replicas()
    executor, follower = cluster.namespaces
    executor["arr"] = np.random.default_rng(1).random(100 * MiB // 8)
    tracemalloc.start()
    try:
        delta = cluster.trackers[0].diff()
        encoded = encode(delta, store)
        _, encode_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        cluster.trackers[0].commit(delta, encoded)
        report = apply(encoded, follower, store)
        _, apply_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(encoded.pointers) == {"arr"}
    assert store.path(encoded.pointers["arr"]).stat().st_size < 100 * MiB + 4096
    assert encode_peak < 4 * MiB  # no pickle copy of the array, let alone two
    assert apply_peak < 100 * MiB + 4 * MiB  # the array's own memory, once
    assert report.bytes_fetched >= 100 * MiB
    assert np.array_equal(follower["arr"], executor["arr"])
    assert follower["arr"].flags.writeable


def test_missing_or_corrupt_objects_name_the_variable(
    replicas: Replicas, store: LocalDirectoryStore
) -> None:
    cluster = replicas(1)
    sent = cluster.run(
        0,
        "import numpy as np\ngone = np.zeros(100_000)\nbad = np.ones(100_000)\n"
        "fine = np.arange(100_000)\nsmall = 's'",
    )
    store.delete(sent.pointers["gone"])
    path = store.path(sent.pointers["bad"])
    path.chmod(0o644)
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))

    follower = {"__name__": "__main__", "gone": "stale", "bad": "stale"}
    with pytest.raises(ApplyFailed) as failed:
        apply(sent, follower, store)
    message = str(failed.value)
    assert "gone: object " + sent.pointers["gone"] in message
    assert str(store) in message
    assert "bad: object " + sent.pointers["bad"] + " does not match its key" in message
    report = failed.value.report
    assert set(report.failed) == {"gone", "bad"}
    assert set(report.applied) == {"fine", "small"}
    assert "gone" not in follower
    assert "bad" not in follower  # no stale value survives
    assert np.array_equal(follower["fine"], np.arange(100_000))

    path.write_bytes(bytes(blob[:100]))  # truncated
    with pytest.raises(ApplyFailed, match=r"bad: object .* is 100 bytes"):
        apply(sent, follower, store)


def test_undecodable_inline_values_and_imports_name_the_variable(
    store: LocalDirectoryStore,
) -> None:
    encoded = EncodedDelta(
        changed={"junk": b"not a frame at all", "ok": serialize(5, {}).to_bytes()},
        imports={"m": "kernelfleet_no_such_module", "j": "json"},
    )
    namespace: dict[str, object] = {}
    with pytest.raises(ApplyFailed) as failed:
        apply(encoded, namespace, store)
    assert set(failed.value.report.failed) == {"junk", "m"}
    assert "kernelfleet_no_such_module" in str(failed.value)
    assert "junk:" in str(failed.value)
    assert namespace["ok"] == 5
    assert "j" in namespace


def test_entries_round_trip_and_malformed_ones_are_refused() -> None:
    encoded = EncodedDelta(
        changed={"a": b"\x00"}, pointers={"b": "0" * 64}, imports={"np": "numpy"}, deleted=["c"]
    )
    assert EncodedDelta.from_dict(pickle.loads(pickle.dumps(encoded.to_dict()))) == encoded
    assert encoded.keys() == {"0" * 64}
    for bad in [
        {"version": 99},
        {"version": 1, "changed": {"a": "str"}},
        {"version": 1, "deleted": [3]},
        [],
    ]:
        with pytest.raises(InvalidRequest):
            EncodedDelta.from_dict(bad)  # type: ignore[arg-type]


def test_digest_is_a_function_of_synced_state_only() -> None:
    one = {"__name__": "__main__", "x": [1, 2], "_": "ignored", "s": {"a", "b", "c"}}
    two = {"__name__": "__main__", "s": {"c", "b", "a"}, "x": [1, 2], "_": "different"}
    tracker_one = NamespaceTracker(one, hidden=())
    tracker_two = NamespaceTracker(two, hidden=())
    assert namespace_digest(one, tracker_one) == namespace_digest(two, tracker_two)
    two["x"].append(3)
    assert namespace_digest(one, tracker_one) != namespace_digest(two, tracker_two)


def test_names_sharing_an_object_travel_together_and_stay_aliased(replicas: Replicas) -> None:
    cluster = replicas()
    sent = cluster.run(0, "shared = [1, 2]\na = {'s': shared}\nb = (shared, 'x')\nalone = [0]")
    assert set(sent.changed) == {"shared,a,b", "alone"}
    follower = cluster.namespaces[1]
    assert follower["a"]["s"] is follower["shared"] is follower["b"][0]
    again = cluster.run(0, "shared.append(3)")  # a and b did not change identity, but share it
    assert set(again.changed) == {"shared,a,b"}
    assert follower["a"]["s"] is follower["shared"]
    assert follower["b"][0] == [1, 2, 3]
    assert len(set(cluster.digests())) == 1


def test_unrelated_arrays_and_instances_are_not_linked(replicas: Replicas) -> None:
    cluster = replicas()
    code = (
        "import numpy as np\nclass Box:\n    def __init__(self, v: int = 0):\n        self.v = v\n"
        "x = np.zeros(10)\ny = np.ones(10)\nb1 = Box(1)\nb2 = Box(2)"
    )
    first = cluster.run(0, code)
    assert all("," not in label for label in first.changed)
    assert set(cluster.run(0, "y += 1\nb2.v = 3").changed) == {"y", "b2"}
    assert cluster.namespaces[1]["b2"].v == 3
