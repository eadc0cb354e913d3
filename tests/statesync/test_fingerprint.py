"""Change detection by fingerprint: every in-place mutation is found, nothing unchanged travels.

The property tests mutate arrays, frames and containers in place at random (through aliases,
views and IPython's ``Out`` cache too) and check the soundness contract: every name whose
value's pickle changed is in the cell's delta, and the follower ends with equal state.
"""

from __future__ import annotations

import gc
import pickle
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernelfleet.kernels.objectstore import MemoryStore
from kernelfleet.kernels.replica.statesync import NamespaceTracker
from kernelfleet.kernels.replica.statesync_fingerprint import FingerprintCache, fingerprint
from kernelfleet.kernels.replica.statesync_pickling import serialize

from .conftest import Cluster, ipython_like_namespace


def digest_of(value: Any, cache: FingerprintCache | None = None) -> str:
    return fingerprint(value, {}, cache or FingerprintCache(), {})


@settings(max_examples=150, deadline=None)
@given(
    array=hnp.arrays(
        dtype=st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(), hnp.unicode_string_dtypes()),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=6),
    ),
    where=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
    layout=st.sampled_from(["C", "F", "strided"]),
)
def test_flipping_any_bit_of_any_array_changes_its_fingerprint(
    array: np.ndarray, where: int, bit: int, layout: str
) -> None:
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    assume(array.dtype.itemsize > 0)
    before = digest_of(array)
    if array.dtype.isnative:  # numpy unpickles some non-native arrays (U, M, m) as native
        copy = pickle.loads(pickle.dumps(array, protocol=5))  # what a follower holds
        assert digest_of(copy) == before, (array.dtype, copy.dtype, array.shape)
    flip_bit(array, where, bit)
    assert digest_of(array) != before


def flip_bit(array: np.ndarray, where: int, bit: int) -> None:
    """Flip one bit of one element of `array` in place, whatever its memory layout."""
    if array.ndim == 0:
        cell = array.reshape(1)
    else:
        index = np.unravel_index(where % array.size, array.shape)
        cell = array[tuple(slice(k, k + 1) for k in index)].reshape(1)
    assert np.shares_memory(cell, array)
    raw = cell.view(np.uint8)
    raw[where % raw.size] ^= 1 << bit


def test_fingerprints_cover_what_the_pickle_carries() -> None:
    frame = pd.DataFrame(
        {
            "n": np.arange(6),
            "s": [f"s{i}" for i in range(6)],
            "t": pd.date_range("2025-01-01", periods=6),
            "c": pd.Categorical(list("abcabc")),
        }
    )
    for mutate in [
        lambda f: f.loc.__setitem__((2, "n"), 99),
        lambda f: f.loc.__setitem__((0, "s"), "changed"),
        lambda f: f.loc.__setitem__((5, "t"), pd.Timestamp("1999-01-01")),
        lambda f: f.loc.__setitem__((1, "c"), "c"),
        lambda f: f.attrs.__setitem__("unit", "kg"),
        lambda f: setattr(f, "columns", ["m", "s", "t", "c"]),
        lambda f: setattr(f, "index", list("abcdef")),
        lambda f: f.insert(0, "new", 1.5),
        lambda f: f.pop("t"),
    ]:
        changed = frame.copy()
        before = digest_of(changed)
        assert digest_of(changed) == before
        mutate(changed)
        assert digest_of(changed) != before
    lists = np.empty(2, dtype=object)
    lists[0], lists[1] = [1], "text"
    held = digest_of(lists)
    lists[0].append(2)  # an object array of mutable objects is pickled element by element
    assert digest_of(lists) != held


def test_an_array_reached_from_several_names_is_hashed_once() -> None:
    big = np.arange(1000.0)
    frame = pd.DataFrame({"a": big})
    cache = FingerprintCache()
    shared: dict[int, Any] = {}
    fingerprint({"x": big, "y": big}, {}, cache, shared)
    assert id(big) in shared
    hashed = len(cache)
    fingerprint(big, {}, cache, {})
    assert len(cache) == hashed
    fingerprint(frame, {}, cache, {})
    fingerprint(frame, {}, cache, {})
    assert len(cache) > hashed


def test_frames_with_string_columns_are_not_linked_through_their_dtype(
    replicas: Any,
) -> None:
    cluster: Cluster = replicas()
    sent = cluster.run(
        0,
        "import pandas as pd\n"
        "months = pd.period_range('2025-01', periods=4, freq='M')\n"
        "a = pd.DataFrame({'s': ['x', 'y'], 'p': months[:2]})\n"
        "b = pd.DataFrame({'s': ['u', 'v'], 'p': months[2:]})\n"
        "c = a",
    )
    assert set(sent.changed) | set(sent.pointers) == {"months", "a,c", "b"}
    again = cluster.run(0, "b.loc[0, 's'] = 'w'")
    assert set(again.changed) | set(again.pointers) == {"b"}
    follower = cluster.namespaces[1]
    assert follower["b"].loc[0, "s"] == "w"
    assert follower["a"] is follower["c"]


def test_a_follower_that_takes_over_does_not_resend_frames(replicas: Any) -> None:
    cluster: Cluster = replicas(3)
    cluster.run(
        0,
        "import numpy as np\nimport pandas as pd\n"
        "df = pd.DataFrame({'n': np.arange(5000), 's': [f'k{i % 7}' for i in range(5000)],"
        " 't': pd.date_range('2025-01-01', periods=5000, freq='h')})\n"
        "df['cat'] = df['s'].astype('category')\nfar = np.asfortranarray(np.ones((30, 40)))\n"
        "strided = np.arange(100)[::3]",
    )
    for tracker in cluster.trackers[1:]:
        assert not tracker.diff()
    sent = cluster.run(1, "df.loc[3, 's'] = 'new'")
    assert set(sent.changed) | set(sent.pointers) == {"df"}
    first, _, third = cluster.namespaces
    assert third["df"].loc[3, "s"] == "new"
    assert first["df"].equals(third["df"])
    assert np.array_equal(first["strided"], third["strided"])
    assert np.array_equal(first["far"], third["far"])


SETUP = """
import numpy as np
import pandas as pd
class Box:
    def __init__(self):
        self.items = []
        self.v = 0
arr = np.arange(12, dtype=np.int64).reshape(3, 4)
alias = arr
view = arr[:, ::2]
far = np.asfortranarray(np.zeros((3, 2)))
when = np.array(['2025-01-01', '2025-02-01'], dtype='datetime64[D]')
rec = np.zeros(3, dtype=[('a', 'i4'), ('b', 'f8')])
df = pd.DataFrame({'n': np.arange(4), 'p': np.linspace(0, 1, 4), 's': list('wxyz')})
lst = [1, 2]
holder = {'l': lst, 'df': df}
box = Box()
objs = np.empty(2, dtype=object)
objs[0] = lst
Out = {3: df}
_ = df
"""
MUTATIONS = [  # each changes some synced value, even when repeated
    "arr[{i} % 3, {j} % 4] += 1",
    "alias[{i} % 3] += {j} + 1",
    "view[{i} % 3, 0] += {j} + 1",
    "far[{i} % 3, {j} % 2] -= 1.5",
    "when[{i} % 2] += np.timedelta64({j} + 1, 'D')",
    "rec['a'][{i} % 3] += {j} + 1",
    "df.loc[{i} % 4, 'p'] += {j} + 0.25",
    "df.iloc[{i} % 4, 0] += {j} + 1",
    "df.loc[{i} % 4, 's'] += 's{j}'",
    "Out[3].loc[{i} % 4, 'n'] -= {j} + 1",
    "_.attrs['k{i}'] = _.attrs.get('k{i}', 0) + {j} + 1",
    "df['extra{i}'] = df.get('extra{i}', 0) + {j} + 1",
    "lst.append({j})",
    "holder['l'][0] += {j} + 1",
    "box.items.append({j})",
    "box.v += {j} + 1",
    "objs[0].insert(0, {i})",
    "holder['df'].loc[{i} % 4, 'n'] += {j} + 9",
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 50), st.integers(0, 50)),
        min_size=1,
        max_size=6,
    )
)
def test_random_in_place_mutations_always_reach_the_follower(
    steps: list[tuple[str, int, int]],
) -> None:
    namespaces = [ipython_like_namespace() for _ in range(2)]
    cluster = Cluster(MemoryStore(), namespaces, [NamespaceTracker(ns) for ns in namespaces])
    executor, follower = namespaces
    cluster.run(0, SETUP)
    for template, i, j in steps:
        before = real_digests(cluster)
        sent = cluster.run(0, template.format(i=i, j=j))
        after = real_digests(cluster)
        changed = {name for name in after if before.get(name) != after[name]}
        assert changed, template  # every mutation here changes some synced value
        assert changed <= sent.names(), (template, changed - sent.names())
        assert fingerprints(executor, cluster.trackers[0]) == fingerprints(
            follower, cluster.trackers[1]
        )
    assert follower["df"].equals(executor["df"])
    assert follower["alias"] is follower["arr"]
    assert follower["holder"]["l"] is follower["lst"] is follower["objs"][0]
    assert follower["holder"]["df"] is follower["df"]


def fingerprints(namespace: dict[str, Any], tracker: NamespaceTracker) -> dict[str, str]:
    """Each synced name's fingerprint: equal content, whatever the arrays' memory layout (a
    strided view arrives as a contiguous copy, so `namespace_digest` would differ)."""
    cache = FingerprintCache()
    return {n: fingerprint(v, namespace, cache, {}) for n, v in tracker.tracked_items(namespace)}


def real_digests(cluster: Cluster) -> dict[str, str]:
    namespace, tracker = cluster.namespaces[0], cluster.trackers[0]
    return {
        name: serialize(value, namespace).digest
        for name, value in tracker.tracked_items()
        if not isinstance(value, type(pytest))
    }


def test_a_diff_leaves_no_garbage_for_the_cycle_collector(replicas: Any) -> None:
    """Each value's fingerprint must be freed by reference counting: garbage in cycles (a
    pickler holding a bound method of itself) waits for a full collection, which takes
    ~100 ms in a namespace holding scikit-learn, inside whichever cell's diff triggers it."""
    cluster: Cluster = replicas()
    cluster.run(
        0,
        "import numpy as np\nimport pandas as pd\n"
        "df = pd.DataFrame({'a': np.arange(10), 's': list('abcdefghij')})\nx = np.ones(5)",
    )
    gc.collect()
    gc.disable()
    try:
        cluster.trackers[0].diff()
        assert gc.collect() == 0
    finally:
        gc.enable()
