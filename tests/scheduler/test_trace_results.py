"""``benchmarks/trace_results.py``: one command writes every June result, and the README's
tables are the ones it builds from the JSON files in results/ (so a number in a table cannot
drift from the file it comes from)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import REPO
from .json_fields import DOCUMENTED_FIELDS

RESULTS = REPO / "results"
README = REPO / "README.md"
POLICIES = ["notebookos", "reservation", "fcfs-batch", "packing"]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "trace_results", REPO / "benchmarks" / "trace_results.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


trace_results = load_script()


def results(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    return document


def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The cells of each body row of the Markdown table whose header starts `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_every_results_file_is_the_run_its_name_says_with_every_field() -> None:
    june = results("june.json")
    no_buffer = results("june_buffer_hosts_0.json")
    mixed = results("june_spot_mixed.json")
    assert list(june["policies"]) == POLICIES
    assert list(mixed["policies"]) == POLICIES
    assert list(no_buffer["policies"]) == ["notebookos", "packing"]
    assert (june["assumptions"]["autoscale_buffer_hosts"], june["assumptions"]["spot_share"]) == (
        1,
        0.0,
    )
    assert no_buffer["assumptions"]["autoscale_buffer_hosts"] == 0
    assert mixed["assumptions"]["spot_share"] == trace_results.SPOT_SHARE
    for document in (june, no_buffer, mixed):
        for name, result in document["policies"].items():
            assert list(result) == list(DOCUMENTED_FIELDS), name
            assert result["events"] == 30_909, name
            assert result["saving_share"] is not None, name
    on_demand = june["policies"]
    assert all(r["gpu_hours_spot"] == 0 and r["revocations"] == 0 for r in on_demand.values())
    assert on_demand["reservation"]["gpu_hours_busy"] == on_demand["reservation"]["gpu_hours_floor"]


def test_the_readme_tables_are_built_from_the_results_files() -> None:
    readme = README.read_text(encoding="utf-8")
    june, mixed = results("june.json")["policies"], results("june_spot_mixed.json")["policies"]
    assert trace_results.policy_table(june) in readme
    assert trace_results.spot_table(mixed, june) in readme
    floor = june["reservation"]["gpu_hours_floor"]
    assert f"hold: {floor:,.0f} GPU-hours" in readme

    # the no-buffer table's mean delay and share of late cells are not in the JSON: the rest is
    no_buffer = results("june_buffer_hosts_0.json")["policies"]
    rows = table_rows(readme, "| buffer hosts | policy |")
    assert [(row[0], row[1]) for row in rows] == [
        ("1", "`notebookos`"),
        ("1", "`packing`"),
        ("0", "`notebookos`"),
        ("0", "`packing`"),
    ]
    for buffer, name, provisioned, _, delay, _, _, migrations, scale_outs in rows:
        result = (june if buffer == "1" else no_buffer)[name.strip("`")]
        assert provisioned == f"{result['gpu_hours_provisioned']:,.0f}"
        assert delay == trace_results.delay_text(result)
        assert (migrations, scale_outs) == (
            f"{result['migrations']:,}",
            f"{result['scale_outs']:,}",
        )


def test_one_command_writes_every_result_and_prints_every_table(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = {name: tmp_path / f"{name}.json" for name in ("june", "no_buffer", "spot")}
    trace_results.main(
        [
            "--trace",
            str(small_trace),
            "--json",
            str(paths["june"]),
            "--json-no-buffer",
            str(paths["no_buffer"]),
            "--json-spot",
            str(paths["spot"]),
            "--no-plot",
        ]
    )
    printed = capsys.readouterr().out
    documents = {name: json.loads(path.read_text()) for name, path in paths.items()}
    assert documents["no_buffer"]["assumptions"]["autoscale_buffer_hosts"] == 0
    assert documents["spot"]["assumptions"]["spot_share"] == trace_results.SPOT_SHARE
    for document in documents.values():
        for result in document["policies"].values():
            assert list(result) == list(DOCUMENTED_FIELDS)
            assert result["events"] == 4
    june, mixed = documents["june"]["policies"], documents["spot"]["policies"]
    assert trace_results.policy_table(june) in printed
    assert trace_results.spot_table(mixed, june) in printed
    assert "| buffer hosts | policy |" in printed
    assert "Floor: " in printed
    assert "NotebookOS's claim" in printed
    # the no-buffer pair has no reservation run of its own: its share is against one added
    assert all(r["saving_share"] is not None for r in documents["no_buffer"]["policies"].values())


def test_a_table_row_holds_every_column_the_issue_names() -> None:
    result = results("june.json")["policies"]["packing"]
    header, _, row = trace_results.policy_table({"packing": result}).splitlines()
    assert len(header.split("|")) == len(row.split("|"))
    for column in (
        "GPU-h provisioned",
        "GPU-h busy",
        "share of the saving",
        "p50 / p95 / p99",
        "scale-outs / -ins",
        "migrations",
        "dollars",
    ):
        assert column in header
    assert "62%" in row
    assert re.search(r"\| 425,330 \|$", row), row


def test_without_matplotlib_it_says_so_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed: the plot is written (tested by the simulator's)")
    missing = tmp_path / "no-such-trace.csv"  # never read: the check comes first
    with pytest.raises(SystemExit) as exited:
        trace_results.main(["--trace", str(missing), "--json", str(tmp_path / "j.json")])
    assert exited.value.code == 2
    assert 'pip install matplotlib (or "kernelfleet[plot]")' in capsys.readouterr().err
    assert not (tmp_path / "j.json").exists()


def test_a_trace_it_cannot_read_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-trace.csv"
    with pytest.raises(SystemExit) as exited:
        trace_results.main(["--trace", str(missing), "--no-plot"])
    assert exited.value.code == 2
    assert str(missing) in capsys.readouterr().err
