"""Gavel's and Shockwave's trace formats; a malformed line is refused with file, line and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.traces import JobTraceError, read_job_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"the papers' data is not at {DATA}")

GAVEL_LINE = (
    "ResNet-18 (batch size 128)\tpython3 main.py --batch_size 128\timage_classification/cifar10"
    "\t--num_steps\t1\t925982\t4\t1\t-1.000000\t536"
)
SHOCKWAVE_LINE = (
    "LM (batch size 10)\tpython3 main.py --batch_size 10\tlanguage_modeling\t--steps\t1\t134583"
    "\t2\tgns\t1\t1.5\t1418\t640"
)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "jobs.trace"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_both_formats_read_column_by_column(tmp_path: Path) -> None:
    gavel, shockwave = read_job_trace(write(tmp_path, GAVEL_LINE, SHOCKWAVE_LINE))
    assert (gavel.line, gavel.job_type, gavel.total_steps, gavel.scale_factor) == (
        1,
        "ResNet-18 (batch size 128)",
        925982,
        4,
    )
    assert (gavel.num_steps_arg, gavel.needs_data_dir, gavel.priority_weight) == (
        "--num_steps",
        True,
        1.0,
    )
    assert (gavel.slo, gavel.arrival_s, gavel.mode, gavel.duration_s) == (
        None,
        536.0,
        "static",
        None,
    )
    assert shockwave.line == 2
    assert (shockwave.mode, shockwave.scale_factor, shockwave.slo) == ("gns", 2, 1.5)
    assert (shockwave.duration_s, shockwave.arrival_s) == (1418.0, 640.0)
    assert shockwave.working_directory == "language_modeling"


def replace_column(line: str, index: int, value: str) -> str:
    fields = line.split("\t")
    fields[index] = value
    return "\t".join(fields)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("a\tb\tc", "3 tab-separated columns; expected 10 \\(Gavel\\) or 12"),
        (replace_column(GAVEL_LINE, 5, "many"), "total_steps 'many' is not int"),
        (replace_column(GAVEL_LINE, 5, "0"), "total_steps 0 must be at least 1"),
        (replace_column(GAVEL_LINE, 6, "0"), "scale_factor 0 must be at least 1"),
        (replace_column(GAVEL_LINE, 4, "2"), "needs_data_dir 2 must be 0 or 1"),
        (replace_column(GAVEL_LINE, 7, "0"), "priority_weight 0 must be positive"),
        (replace_column(GAVEL_LINE, 9, "nan"), "arrival_time 'nan' is not finite"),
        (replace_column(GAVEL_LINE, 9, "-5"), "arrival_time -5 must not be negative"),
        (replace_column(GAVEL_LINE, 0, " "), "empty job_type"),
        (replace_column(SHOCKWAVE_LINE, 7, "turbo"), "mode 'turbo' is not one of accordion, gns"),
        (replace_column(SHOCKWAVE_LINE, 10, "x"), "duration 'x' is not float"),
    ],
)
def test_malformed_line_names_file_line_and_why(tmp_path: Path, line: str, why: str) -> None:
    path = write(tmp_path, GAVEL_LINE, line)
    with pytest.raises(JobTraceError, match=why) as caught:
        read_job_trace(path)
    assert caught.value.message.startswith(f"{path}:2: ")


def test_out_of_order_arrivals_and_empty_traces(tmp_path: Path) -> None:
    late_first = replace_column(GAVEL_LINE, 9, "900")
    path = write(tmp_path, late_first, "", GAVEL_LINE)
    with pytest.raises(JobTraceError, match=r"jobs.trace:3: arrival 536 s is before"):
        read_job_trace(path)
    with pytest.raises(JobTraceError, match="no jobs in the trace"):
        read_job_trace(write(tmp_path, "", ""))
    with pytest.raises(JobTraceError, match="cannot read trace"):
        read_job_trace(tmp_path / "absent.trace")


@needs_data
def test_the_papers_traces_read_whole() -> None:
    for trace in [
        *(DATA / "gavel" / "traces").glob("*.trace"),
        *(DATA / "shockwave" / "traces").glob("*.trace"),
    ]:
        lines = [line for line in trace.read_text(encoding="utf-8").splitlines() if line.strip()]
        jobs = read_job_trace(trace)
        assert len(jobs) == len(lines)
    dynamic = read_job_trace(next((DATA / "shockwave" / "traces").glob("120_*.trace")))
    assert len(dynamic) == 120
    assert {job.mode for job in dynamic} == {"static", "gns", "accordion"}
    las = read_job_trace(DATA / "gavel" / "traces" / "max_min_fairness.trace")
    assert {job.scale_factor for job in las} == {1, 2, 4}
