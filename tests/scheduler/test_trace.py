"""Reading traces and recovering sessions: small literal files, then the June trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelfleet.scheduler.trace import TraceError, read_trace

from .traces import HEADER, write_trace


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    return write_trace(tmp_path / "trace.csv", body, header)


def test_sessions_split_on_overlap_and_gpu_change(tmp_path: Path) -> None:
    # 0: [10, 12); 1 starts at 12 = end of 0 -> same session; 2 starts at 13 < 12+5=17 -> new;
    # 3 at 30 >= 18 but 4 GPUs -> new; 4 at 40 >= 31, 4 GPUs -> same as 3.
    path = write(
        tmp_path,
        "0,1,10,0,a,2,0\n1,1,12,0,a,5,0\n2,1,13,0,b,5,0\n3,4,30,0,c,1,0\n4,4,40,0,c,3,0\n",
    )
    trace = read_trace(path)
    assert [len(s.events) for s in trace.sessions] == [2, 1, 2]
    assert [s.gpus for s in trace.sessions] == [1, 1, 4]
    assert trace.sessions[0].start_min == 10
    assert trace.sessions[0].end_min == 17
    assert trace.sessions[2].end_min == 43
    assert trace.gpu_split() == {1: 3, 4: 2}
    assert trace.skipped == ()


def test_time_going_backwards_starts_a_session(tmp_path: Path) -> None:
    trace = read_trace(write(tmp_path, "0,1,100,0,a,2,0\n1,1,50,0,a,2,0\n1,1,60,0,a,2,0\n"))
    assert [len(s.events) for s in trace.sessions] == [1, 2]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("0,1,10,0,a,-2,0\n", "line 2: negative duration -2"),
        ("0,1,10,0,a,2,0\n1,x,10,0,a,2,0\n", "line 3: num_gpu is not a number: 'x'"),
        ("0,1,10,0,a,2\n", "line 2: expected 7 fields, found 6"),
        ("0,0,10,0,a,2,0\n", "line 2: num_gpu must be a positive integer"),
        ("0,1.5,10,0,a,2,0\n", "line 2: num_gpu must be a positive integer"),
        ("0,1,-1,0,a,2,0\n", "line 2: negative submit_time"),
        ("0,1,nan,0,a,2,0\n", "line 2: submit_time is not finite"),
    ],
)
def test_bad_rows_name_their_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, body))


def test_bad_rows_can_be_skipped_and_are_counted(tmp_path: Path) -> None:
    trace = read_trace(
        write(tmp_path, "0,1,10,0,a,2,0\n1,1,12,0,a,-5,0\n2,1,20,0,a,1,0\n"), skip_bad_rows=True
    )
    assert len(trace.events) == 2
    assert trace.skipped == ("line 3: negative duration -5",)


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        ("", "", "the trace is empty"),
        (HEADER, "", "no usable events"),
        ("job_id,num_gpu,submit_time\n", "0,1,2\n", r"missing \['iterations'"),
        (HEADER.strip() + ",extra\n", "0,1,10,0,a,2,0,1\n", r"unknown \['extra'\]"),
        (
            "num_gpu,job_id,submit_time,iterations,model_name,duration,interval\n",
            "1,0,10,0,a,2,0\n",
            "must be in the order",
        ),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, header: str, body: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path, body, header=header))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "nope.csv")


def test_june_trace_counts(june_trace: Path) -> None:
    trace = read_trace(june_trace)
    assert len(trace.events) == 30_909
    assert trace.gpu_split() == {1: 15_214, 4: 6_192, 8: 9_503}
    assert trace.skipped == ()
    assert len(trace.sessions) == 8_435
    assert 3.6 < len(trace.events) / len(trace.sessions) < 3.8
    assert sum(len(s.events) for s in trace.sessions) == 30_909


def test_select_takes_whole_sessions_in_start_order(tmp_path: Path) -> None:
    # sessions (file order): A = lines 2-3 from minute 50, B = line 4 at 10, C = line 5 at 30
    trace = read_trace(
        write(tmp_path, "0,1,50,0,a,2,0\n1,1,52,0,a,1,0\n2,4,10,0,b,5,0\n3,1,30,0,c,1,0\n")
    )
    picked = trace.select(start_min=20, sessions=2)
    assert [(s.id, s.start_min, len(s.events)) for s in picked.sessions] == [(0, 30, 1), (1, 50, 2)]
    assert [e.line for e in picked.events] == [5, 2, 3]
    assert [s.start_min for s in trace.select().sessions] == [10, 30, 50]
    with pytest.raises(TraceError, match="no session starts at or after minute 60"):
        trace.select(start_min=60)
