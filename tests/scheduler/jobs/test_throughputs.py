"""The throughput table reader: Gavel's JSON as it is, lookups, errors naming file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.throughputs import ThroughputTable, ThroughputTableError, parse_key
from kernelfleet.scheduler.jobs.traces import read_job_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"the papers' data is not at {DATA}")

DOCUMENT = {
    "v100": {
        "('LM (batch size 5)', 1)": {"null": 10.5, "('LM (batch size 5)', 1)": [6.0, 6.0]},
        "('LM (batch size 5)', 2)": {"null": 19.0},
    },
    "k80": {"('LM (batch size 5)', 1)": {"null": 2.5}, "('LM (batch size 5)', 2)": {"null": 4.0}},
}


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "throughputs.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_isolated_throughputs_per_type_and_scale_factor(tmp_path: Path) -> None:
    table = ThroughputTable.load(write(tmp_path, DOCUMENT))
    assert table.gpu_types == ("v100", "k80")
    assert table.isolated("LM (batch size 5)", 1, "v100") == 10.5
    assert table.isolated("LM (batch size 5)", 2, "k80") == 4.0
    assert table.throughputs_for("LM (batch size 5)", 2, ["k80", "v100"]) == {
        "k80": 4.0,
        "v100": 19.0,
    }


def test_parse_key_accepts_only_a_name_and_a_positive_scale_factor() -> None:
    assert parse_key("('ResNet-50 (batch size 64)', 4)") == ("ResNet-50 (batch size 64)", 4)
    for bad in ("ResNet-50", "('a', 0)", "('a', 'b')", "('a', 1, 2)", "('a'"):
        assert parse_key(bad) is None


def test_unknown_job_type_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, DOCUMENT)
    table = ThroughputTable.load(path)
    with pytest.raises(ThroughputTableError, match=r"throughputs\.json: v100: .*'Nope' on 1 GPU"):
        table.isolated("Nope", 1, "v100")
    with pytest.raises(ThroughputTableError, match=r"no GPU type 'a100' \(known: v100, k80\)"):
        table.isolated("LM (batch size 5)", 1, "a100")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([1, 2], "expected an object of GPU types"),
        ({}, "expected an object of GPU types"),
        ({"v100": []}, "GPU type 'v100' is not an object"),
        ({"v100": {"LM": {"null": 1.0}}}, "key 'LM' is not"),
        ({"v100": {"('LM', 1)": {"other": 1.0}}}, r"\('LM', 1\): no numeric isolated"),
        ({"v100": {"('LM', 1)": {"null": "fast"}}}, "no numeric isolated"),
        ({"v100": {"('LM', 1)": {"null": -1}}}, "negative throughput"),
    ],
)
def test_malformed_files_are_refused_with_file_and_key(
    tmp_path: Path, document: object, message: str
) -> None:
    with pytest.raises(ThroughputTableError, match=message) as caught:
        ThroughputTable.load(write(tmp_path, document))
    assert "throughputs.json" in caught.value.message


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(ThroughputTableError, match="cannot read throughputs"):
        ThroughputTable.load(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ThroughputTableError, match=r"bad\.json is not JSON"):
        ThroughputTable.load(bad)


@needs_data
@pytest.mark.parametrize(
    "name",
    [
        "gavel/physical_cluster_throughputs.json",
        "gavel/simulation_throughputs.json",
        "shockwave/tacc_throughputs.json",
    ],
)
def test_the_papers_tables_cover_every_job_of_gavels_traces(name: str) -> None:
    table = ThroughputTable.load(DATA / name)
    for trace in (DATA / "gavel" / "traces").glob("*.trace"):
        for job in read_job_trace(trace):
            measured = table.throughputs_for(
                job.job_type, job.scale_factor, ["v100", "p100", "k80"]
            )
            assert max(measured.values()) > 0, (trace.name, job.line)
