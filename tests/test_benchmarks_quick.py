"""``benchmarks/vs_local.py --quick`` runs end to end and writes every figure it promises.

The figures themselves belong to the machine that measures them: printed, never compared with a
target. What is checked is the document's shape and that each figure is a real measurement (a
positive number), so a phase that silently measured nothing fails here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_local.py"
SIDES = {"local", "kernelfleet"}
PHASES = {"start_s", "cells_s", "shutdown_s", "total_s"}
SIGNED = {"replica_beyond_plain"}  # a difference: its sign is what it reports


def figures(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of the JSON document with its path."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from figures(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from figures(value, f"{path}/{i}")
    else:
        yield path, node


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_vs_local_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "vs_local.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["parameters"]["replicas"] == 3
    assert report["roundtrip_ms"].keys() == SIDES
    assert all(
        side["n"] == report["parameters"]["cells"] for side in report["roundtrip_ms"].values()
    )
    assert report["parameters"]["pool"] == 1
    assert report["pool"]["starts_served"] == 1, "the pooled side's start was served from the pool"
    for lifecycle in ("kernel_start_s", "restart_s", "shutdown_s"):
        assert report[lifecycle].keys() == {*SIDES, "kernelfleet_cold"}
        assert all(len(side["samples"]) == 1 for side in report[lifecycle].values())
    (name, notebook), *others = report["notebooks"].items()
    assert (name, others) == ("pandas_sales", [])
    assert notebook["code_cells"] >= 15
    assert notebook["local"].keys() == notebook["kernelfleet"].keys() == PHASES
    memory = report["memory"]
    assert memory["local"]["processes"] == 1
    assert memory["kernelfleet"]["processes"] == 3, "one process per replica"
    assert set(report["ratios"]) == {
        "roundtrip_p50", "roundtrip_p99", "kernel_start", "restart", "shutdown", "idle_kernel_pss",
        "kernel_start_cold", "shutdown_cold",
        "notebook_pandas_sales_total", "notebook_pandas_sales_cells",
    }  # fmt: skip

    measured = [
        (p, v) for p, v in figures(report) if p.split("/")[1] not in ("machine", "parameters")
    ]
    assert len(measured) > 40
    for path, value in measured:
        assert isinstance(value, int | float), path
        assert math.isfinite(value), path
        if path.split("/")[1] != "load_average_1min" and path.split("/")[2] not in SIGNED:
            assert value > 0, f"{path} = {value}"
    assert "cell round trip p50" in done.stdout


STAGES_SCRIPT = SCRIPT.with_name("cell_stages.py")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cell_stages_cover_the_whole_round_trip(tmp_path: Path) -> None:
    """Every stage of the stage log is stamped for every cell, on both paths, and the stages
    follow each other: their means add up to the mean round trip (means are additive). Each
    notebook cell is broken down too, its stages within its round trip."""
    out, notebook_path = tmp_path / "stages.json", tmp_path / "small.ipynb"
    cells = ["import numpy as np", "a = np.arange(10_000)", "b = a * 2", "float(b.sum())"]
    nbformat.write(new_notebook(cells=[new_code_cell(code) for code in cells]), notebook_path)
    arguments = f"--cells 3 --warmup 1 --notebook {notebook_path} --json {out}".split()
    done = subprocess.run(
        [sys.executable, str(STAGES_SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=220,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["paths"]) == {"D", "E"}
    for key, path in report["paths"].items():
        assert path["n"] == 3, key
        stages = path["stages_ms"]
        chain = [name for name in stages if "beside the chain" not in name]
        assert len(chain) == len(stages) - 1 >= 12, key
        # the idle status (iopub) may reach the client before the reply (shell): the last stage
        # may be negative; every other stage is between stamps taken in order along one path
        ordered = [name for name in stages if name != "reply -> idle status at client"]
        assert all(stages[name]["p50"] >= 0 for name in ordered), key
        total = sum(stages[name]["mean"] for name in chain)
        assert total == pytest.approx(path["round_trip_ms"]["mean"], rel=1e-6), key
        assert len(path["raft"]["raft_leader"]) == 1, f"{key}: one Raft leader"
        assert len(path["raft"]["executor"]) == 1, f"{key}: one executor ran the cell"
    notebook = report["notebook_cells"]
    assert len(notebook) == len(cells), "every code cell of the notebook"
    for cell in notebook:
        stages = cell["stages_ms"].values()
        assert all(ms >= 0 for ms in stages), cell
        assert sum(stages) <= cell["round_trip_ms"] * (1 + 1e-9), cell


DIFF_SCRIPT = SCRIPT.with_name("namespace_diff.py")


@pytest.mark.timeout(120)
def test_namespace_diff_times_every_cell_and_sends_only_what_changed(tmp_path: Path) -> None:
    notebook = new_notebook(
        cells=[
            new_code_cell("import numpy as np\nimport pandas as pd"),
            new_code_cell("df = pd.DataFrame({'n': np.arange(1000), 's': ['k'] * 1000})"),
            new_code_cell("other = [1, 2]"),
            new_code_cell("df.loc[3, 's'] = 'changed'"),
            new_code_cell("df.dtypes"),
        ]
    )
    path = tmp_path / "small.ipynb"
    nbformat.write(notebook, path)
    out = tmp_path / "diff.json"
    command = [sys.executable, str(DIFF_SCRIPT), "--notebook", str(path), "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    print(result.stdout)
    summary = json.loads(out.read_text())
    assert [cell["sent"] for cell in summary["cells"]] == [[], ["df"], ["other"], ["df"], []]
    assert all(cell["diff_ms"] > 0 and cell["encode_ms"] > 0 for cell in summary["cells"])
    assert summary["sent_bytes"] == sum(cell["sent_bytes"] for cell in summary["cells"]) > 0
    assert "sum" in result.stdout


SCALE_SCRIPT = SCRIPT.with_name("gateway_scale.py")
MAY_BE_ZERO = {"cpu_percent", "failed", "host_losses"}
"""Figures that are truly 0 on a quiet run: an agent idle for 2 s uses less than a clock tick."""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gateway_scale_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    done = subprocess.run(
        [sys.executable, str(SCALE_SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    parameters = report["parameters"]
    cells = round(parameters["rate"] * parameters["stream_seconds"])
    expected = {"single": (1, 1, parameters["kernels"]), "replicated": (3, 3, 2)}
    assert report["fleets"].keys() == expected.keys()
    for label, (hosts, replicas, kernels) in expected.items():
        fleet = report["fleets"][label]
        assert (fleet["hosts"], fleet["replicas"]) == (hosts, replicas), label
        assert fleet["start"]["kernels_started"] == kernels, fleet["start"]
        assert fleet["start"]["stopped_early"] is None
        assert fleet["memory"]["processes"] == kernels * replicas, "one process per replica"
        for scale, count in (("one_kernel", 1), ("many_kernels", kernels)):
            figures_at = fleet[scale]
            assert figures_at["kernels"] == count
            assert figures_at["cells_ms"]["n"] == cells
            for window in ("idle", "stream"):
                assert len(figures_at[window]["agents"]) == hosts, "every agent measured"
                assert figures_at[window]["loop_lag"]["samples"] > 0, "the probe ran"
                assert figures_at[window]["host_reports"]["samples"] > 0, "heartbeats counted"
        assert set(fleet["ratios"]) == {"p50", "p99"}

    measured = [
        (path, value)
        for path, value in figures(report)
        if path.split("/")[1] == "fleets" and "/failures/" not in path
    ]
    assert len(measured) > 200
    for path, value in measured:
        name = path.rsplit("/", 1)[1]
        if value is None:  # beyond the top bucket, or no early stop
            assert name in ("stopped_early", "p50_le_ms", "p99_le_ms"), path
            continue
        assert isinstance(value, int | float), path
        assert math.isfinite(value), path
        if name in MAY_BE_ZERO or name.startswith("over_"):
            assert value >= 0, f"{path} = {value}"
        else:
            assert value > 0, f"{path} = {value}"
    assert "cell round trip p50" in done.stdout
