"""The notice for values that cannot sync: one wording, once per name for the kernel's life."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.kernels.replica.statesync_notice import likely_unsyncable, notice, what_it_is

from .conftest import Cluster

Replicas = Callable[..., Cluster]

WORDING = re.compile(
    r"^kernelfleet: (\w+) \((an? [\w ]+)\) stays on this replica: it cannot be copied to the "
    r"kernel's other replicas, so a cell that runs on another one \(for a free GPU, or after "
    r"this one is lost\) will not find it\.$"
)


def told(lines: list[str]) -> dict[str, str]:
    """name -> what the notice calls it; every line in the one wording."""
    matches = [WORDING.match(line) for line in lines]
    assert all(matches), lines
    return {m.group(1): m.group(2) for m in matches if m}


class Widget:
    """Stands for an ipywidgets widget: its comm ties it to the kernel (here, a lock)."""

    __module__ = "ipywidgets.widgets.widget"

    def __init__(self) -> None:
        self.comm = threading.Lock()


class HoldsALock:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_values_of_kinds_that_never_sync_are_told_at_the_end_of_their_cell(
    replicas: Replicas, tmp_path: Path
) -> None:
    cluster = replicas()
    (tmp_path / "data.txt").write_text("x")
    executor = cluster.namespaces[0]
    executor["Widget"] = Widget  # defined elsewhere, as ipywidgets is
    code = (
        f"import io, threading\nhandle = open({str(tmp_path / 'data.txt')!r})\n"
        "lock = threading.Lock()\ngen = (i for i in range(3))\nslider = Widget()\n"
        "buffer = io.BytesIO(b'x')\nok = 1"
    )
    exec(code, executor)
    try:
        tracker = cluster.trackers[0]
        assert told(tracker.early_notices()) == {
            "handle": "an open file",
            "lock": "a lock",
            "gen": "a generator",
            "slider": "a widget",
        }, "a BytesIO pickles: not told"
        assert tracker.early_notices() == [], "once"
        sent = cluster.sync(0)
        assert {"handle", "lock", "gen", "slider"} <= set(sent.problems)
        assert tracker.notices(sent.problems) == [], "told already, before the reply"
        exec("lock = threading.Lock()", executor)  # rebound: a problem again, no new notice
        assert tracker.early_notices() == []
        assert "lock" in cluster.sync(0).problems
    finally:
        executor["handle"].close()


def test_other_unpicklable_values_are_told_once_after_the_sync_found_them(
    replicas: Replicas,
) -> None:
    cluster = replicas()
    executor = cluster.namespaces[0]
    executor["HoldsALock"] = HoldsALock
    exec("guarded = HoldsALock()", executor)
    tracker = cluster.trackers[0]
    assert tracker.early_notices() == [], "not a kind known never to sync"
    sent = cluster.sync(0)
    assert told(tracker.notices(sent.problems)) == {"guarded": "a HoldsALock object"}
    exec("guarded = HoldsALock()", executor)
    assert tracker.notices(cluster.sync(0).problems) == [], "once for the kernel's life"


def test_a_name_another_replica_told_is_not_told_again(replicas: Replicas) -> None:
    cluster = replicas(3)
    exec("import threading\nlock = threading.Lock()", cluster.namespaces[0])
    assert told(cluster.trackers[0].early_notices()) == {"lock": "a lock"}
    cluster.sync(0)  # the entry's problems reach the others
    follower = cluster.namespaces[1]
    assert "lock" not in follower
    exec("import threading\nlock = threading.Lock()", follower)  # the user runs it again there
    assert cluster.trackers[1].early_notices() == []
    assert cluster.trackers[1].notices(cluster.sync(1).problems) == []


def test_the_wording_names_the_value_and_what_it_is() -> None:
    values: dict[str, Any] = {"a lock": threading.RLock(), "a widget": Widget()}
    for words, value in values.items():
        assert what_it_is(value) == words
        assert likely_unsyncable(value)
    assert what_it_is(HoldsALock()) == "a HoldsALock object"
    assert not likely_unsyncable(HoldsALock())
    assert told([notice("w", Widget())]) == {"w": "a widget"}
