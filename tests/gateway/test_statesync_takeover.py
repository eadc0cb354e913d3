"""A replica that takes over after in-place mutations holds exactly the committed state.

State sync sends only the names whose fingerprint changed (kernels/replica/statesync_fingerprint).
Here real replicas run cells that mutate values in place, through aliases and IPython's output
cache (``_``, ``Out``), then the executor is killed and the next cell runs on a follower: it
must see every mutation.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SETUP = """
import numpy as np
import pandas as pd
class Box:
    def __init__(self):
        self.v = 0
        self.items = []
df = pd.DataFrame({"n": np.arange(6), "p": np.linspace(0.0, 1.0, 6), "s": list("abcdef")})
arr = np.arange(20_000, dtype=np.float64).reshape(100, 200)
alias = arr
view = arr[:, ::2]
lst = [1, 2]
holder = {"l": lst, "df": df}
box = Box()
"""
SHOW = "df"  # its value lands in IPython's Out cache and `_`
MUTATE = """
_.loc[0, "n"] = 99
Out[max(Out)].loc[1, "p"] = -1.0
holder["df"].loc[2, "s"] = "changed"
df["q"] = df["n"] * 2
arr[0, 0] += 1
alias[1] += 5
view[2, 1] = -7
lst.append(3)
holder["l"].append(4)
box.v = 7
box.items.append("x")
"""
CHECK = """
print(
    df.to_json(),
    float(arr.sum()),
    arr[0, 0], arr[1, 0], arr[2, 2],
    alias is arr,
    lst, holder["l"] is lst, holder["df"] is df,
    box.v, box.items,
)
"""


def expected_output() -> str:
    namespace: dict = {"__name__": "__main__"}
    for code in (SETUP, SHOW):
        exec(code, namespace)
    namespace["_"] = namespace["df"]
    namespace["Out"] = {2: namespace["df"]}
    exec(MUTATE, namespace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(CHECK, namespace)
    return printed.getvalue()


async def test_a_follower_that_takes_over_sees_every_in_place_mutation(fleet_factory):
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        for code in (SETUP, SHOW, MUTATE):
            reply = await client.execute(code, timeout=60)
            assert reply.reply["status"] == "ok", (code, reply.iopub)
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        (executor,) = [r for r in model["replicas"] if r["id"] == model["executor"]]

        os.kill(executor["pid"], signal.SIGKILL)

        after = await client.execute(CHECK, timeout=60)
        assert after.reply["status"] == "ok", after.iopub
        now = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"]
        assert now != executor["id"], "the next cell ran on a replica that took over"
        assert after.stdout == expected_output()
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
