"""The chaos soak (issue 12 item 7): a short one on the default 3-host fleet, and its verdict.

The short soak (`kernelfleet.testing.chaos_soak.run_soak`, as ``benchmarks/chaos.py`` runs it
for minutes) takes every fault kind in turn, one every few seconds, each aimed at the replica or
host running cells, while three kernels run counting cells. One soak (about 80 s) serves every
test below it: nothing may be lost (no kernel, no cell run twice, no cell answered ok without
its effect, no failed cell with an effect, no replica that differs), every kernel stays listed
across gateway restarts, and losing the executor's host costs about a second. The verdict's own
tests above it feed it records and lists with each of those defects.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.testing import TOKEN, Fleet, kernel_reachable_folder
from kernelfleet.testing.chaos import CellRecord, KernelDriver, Outcome, Workload, judge
from kernelfleet.testing.chaos_faults import Fault, FaultKind, Soak
from kernelfleet.testing.chaos_soak import SoakConfig, failover_times, render, run_soak
from kernelfleet.testing.netns import NamespacesUnavailable

BROKEN = (
    "lost_kernels",
    "cells_twice",
    "cells_lost_silently",
    "cells_failed_with_effect",
    "check_failures",
    "replicas_differ",
)


# ---- the verdict ----------------------------------------------------------------------------


def _driver(*cells: tuple[int, Outcome]) -> KernelDriver:
    driver = KernelDriver(Fleet(Path("/nonexistent"), TOKEN, {}), "k1", Workload())
    driver.cells = [
        CellRecord(n, sent=float(n), outcome=outcome, done=n + 0.5) for n, outcome in cells
    ]
    return driver


OK, ERROR, NO_REPLY = Outcome.OK, Outcome.ERROR, Outcome.NO_REPLY


def test_a_clean_run_breaks_nothing():
    driver = _driver((1, OK), (2, ERROR), (3, NO_REPLY), (4, NO_REPLY), (5, OK))
    lists = {"L": [0, 1, 3, 5], "RUNS": [1, 2, 3, 5]}  # 2 failed its check; 4 never ran
    verdict = judge(driver, lists, {"r-1": dict(lists), "r-2": dict(lists)})
    assert verdict.model() == {
        "kernel": "k1",
        "lost": None,
        "twice": [],
        "lost_silently": [],
        "failed_with_effect": [],
        "replicas_differ": {},
        "replicas_checked": 2,
        "anomalies": [],
        "replicas": {},
    }


def test_a_cell_run_twice_is_found_in_runs_or_in_effects():
    driver = _driver((1, OK), (2, OK), (3, OK))
    assert judge(driver, {"L": [0, 1, 2, 3], "RUNS": [1, 2, 2, 3]}, {}).twice == [2]
    assert judge(driver, {"L": [0, 1, 2, 3, 3], "RUNS": [1, 2, 3]}, {}).twice == [3]


def test_an_ok_cell_without_its_effect_is_lost_silently():
    driver = _driver((1, OK), (2, OK), (3, OK))
    verdict = judge(driver, {"L": [0, 1, 3], "RUNS": [1, 3]}, {})
    assert verdict.lost_silently == [2]


def test_an_error_reply_with_an_effect_is_a_lie_but_no_reply_may_go_either_way():
    driver = _driver((1, ERROR), (2, NO_REPLY), (3, OK))
    verdict = judge(driver, {"L": [0, 1, 2, 3], "RUNS": [1, 2, 3]}, {})
    assert verdict.failed_with_effect == [1]


def test_a_replica_that_differs_or_cannot_be_read_is_named():
    driver = _driver((1, OK), (2, OK))
    lists = {"L": [0, 1, 2], "RUNS": [1, 2]}
    behind = {"L": [0, 1], "RUNS": [1]}
    verdict = judge(driver, lists, {"r-1": lists, "r-2": behind, "r-3": "TimeoutError: "})
    assert sorted(verdict.replicas_differ) == ["r-2", "r-3"]
    assert verdict.replicas_checked == 3


def test_a_kernel_whose_lists_cannot_be_read_is_lost():
    assert judge(_driver((1, OK)), None, {}).lost


def test_failover_is_the_time_to_the_next_ok_cell_sent_after_the_fault_by_each_kernel_hit():
    driver = _driver((1, OK), (2, NO_REPLY), (3, ERROR), (4, OK), (5, OK))  # done at n + 0.5
    faults = [
        Fault(FaultKind.KILL_REPLICA, at=1.2, target="r-1", kernels=["k1"], executors=["k1"]),
        Fault(FaultKind.KILL_GATEWAY, at=5.6, target="gateway", kernels=["k1"]),
    ]
    every = failover_times(faults, [driver])
    assert (every["n"], every["never"]) == (1, 1)
    # cell 1, in flight at the fault, answered at 1.5: the next cell sent after it counts
    assert every["by_kind"]["kill-replica"]["max"] == pytest.approx(4.5 - 1.2)
    assert failover_times(faults, [driver], executors_only=True)["n"] == 1


# ---- the short soak -------------------------------------------------------------------------

SHORT = SoakConfig(
    duration=50,
    kernels=3,
    hosts=3,  # the default fleet of `kernelfleet up`: no spare host to replace on
    seed=12,
    soak=Soak(interval=6, stop_for=3, cut_for=8, down=3, heal_timeout=60, in_turn=True, aim=True),
    workload=Workload(cell_timeout=30, lost_after=90),
)
HOST_LOSS = ("kill-agent (machine)", "cut-network")


@pytest.fixture(scope="module")
def soak() -> dict[str, Any]:
    """One short soak's report, shared by the tests below (it takes 60-80 s)."""
    folder = kernel_reachable_folder()  # kernels run as users of their own, as in production
    try:
        report = asyncio.run(run_soak(folder, SHORT))
    except NamespacesUnavailable as e:
        pytest.skip(f"network namespaces (for cut-network): {e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("\n" + render(report))
    return report


@pytest.mark.chaos
@pytest.mark.timeout(300)  # the first test using `soak` waits for it
def test_the_short_soak_meets_every_fault_kind_and_runs_cells(soak):
    assert set(soak["faults"]) == {kind.value for kind in FaultKind}, soak["fault_log"]
    assert soak["faults_skipped"] == []
    assert soak["cells"]["ok"] > 100, soak["cells"]
    assert soak["replicas_checked"] == SHORT.kernels * 3, soak["kernels"]


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize("figure", BROKEN)
def test_nothing_is_lost_or_run_twice(soak, figure):
    assert soak[figure] == 0, render(soak)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_restarted_gateway_keeps_listing_every_kernel(soak):
    assert soak["faults"]["kill-gateway"] >= 1
    assert soak["unlisted_kernel_s"] == 0, render(soak)


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize("label", HOST_LOSS)
def test_the_executor_s_host_lost_costs_about_a_second(soak, label):
    """Typically under the heartbeat timeout (5 s), which alone would take at least that long:
    the host's loss was seen by its link (about a second: benchmarks/failover.py measures it,
    and the 2 s a silent link is given). None near the 15 s of a stall on a delta nobody will
    publish (a LEAD copy committed late once cost 13 s here), whatever the machine's load."""
    summary = soak["executor_failover_s"]["by_kind"].get(label)
    if summary is None:
        pytest.skip(f"no {label} hit an executor in this soak")
    assert summary["p50"] < 5, summary
    assert summary["max"] < 10, summary


# ---- the command line -----------------------------------------------------------------------

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


def test_the_command_names_the_fault_kinds_it_knows_when_given_another():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--faults", "kill-replica,unplug-rack"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "'unplug-rack' is not a valid FaultKind" in result.stderr
    assert "kill-replica,kill-agent,kill-gateway,stop-replica,cut-network" in result.stderr


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_command_runs_a_soak_and_writes_its_figures(tmp_path):
    out = tmp_path / "chaos.json"
    command = [
        sys.executable, str(SCRIPT), "--duration", "10", "--kernels", "2",
        "--fault-interval", "4", "--faults", "kill-replica,stop-replica", "--stop-seconds", "2",
        "--json", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=220)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["kernels"] == 2
    assert sum(report["faults"].values()) >= 1
    assert report["cells"]["ok"] > 0
    assert "lost kernels: 0; cells run twice: 0; lost silently: 0" in result.stdout
