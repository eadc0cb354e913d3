"""The job library's pure parts: records read from the contract's JSON, how they show, the
body of a submission, and shortened ids. (Against a live gateway: tests/jobs/test_live.py.)"""

from __future__ import annotations

import base64
import re

import cloudpickle
import pytest

from kernelfleet.jobs import AmbiguousJobId, Job, JobLogs, JobPolicy, JobsStatus, Simulation
from kernelfleet.jobs.client import match_job_id, submission
from kernelfleet.jobs.render import text_table

RUNNING = {
    "id": "job-1a2b3c4d",
    "name": "train",
    "owner_kernel": "k-1",
    "state": "running",
    "gpus": 2,
    "steps": 20000,
    "steps_done": 9000,
    "weight": 1.0,
    "throughput": {"v100": 12.5, "k80": 3.25},
    "lease": {"host": "host-1", "gpu_type": "v100", "devices": ["0", "1"]},
    "submitted_at": "2026-11-24T06:00:00+00:00",
    "started_at": "2026-11-24T06:00:02+00:00",
    "finished_at": None,
    "preemptions": 1,
    "lost_steps": 40,
    "restarts": 1,
    "exit_code": None,
    "error": None,
    "log_tail": ["step 9000 loss 0.41"],
}
CRASHED = {
    **RUNNING,
    "id": "job-9f8e7d6c",
    "name": "broken",
    "state": "failed",
    "steps_done": 120,
    "lease": None,
    "throughput": {},
    "exit_code": 1,
    "error": "exited with code 1: ZeroDivisionError: division by zero",
    "log_tail": ["Traceback (most recent call last):", "ZeroDivisionError: division by zero"],
}
QUEUED = {"id": "job-1a2b0000", "name": "later", "state": "queued", "gpus": 4, "steps": 10}


def test_a_job_record_reads_every_field_of_the_contract():
    job = Job.from_json(RUNNING)
    assert job.progress == pytest.approx(0.45)
    assert job.lease is not None
    assert job.lease.devices == ("0", "1")
    assert str(job.lease) == "host-1 [0, 1]"
    assert job.throughput_text() == "12.5 steps/s (v100)"  # the leased type, not the best
    assert (job.preemptions, job.lost_steps, job.restarts) == (1, 40, 1)
    assert not job.finished
    assert Job.from_json(CRASHED).finished


def test_a_record_missing_fields_reads_with_empty_values():
    job = Job.from_json(QUEUED)
    assert (job.steps_done, job.lease, job.throughput, job.log_tail) == (0, None, {}, ())
    assert job.throughput_text() == "-"
    assert job.row()[4] == "0%"


def test_status_shows_a_row_per_job_and_a_crashed_jobs_log_tail():
    status = JobsStatus.from_json(
        {"policy": "max_min_fairness", "jobs": [RUNNING, CRASHED, QUEUED]}
    )
    text = repr(status)
    assert "policy max_min_fairness · 1 queued, 1 running, 2 GPUs lent" in text
    row = next(line for line in text.splitlines() if line.startswith("job-1a2b3c4d"))
    assert re.search(
        r"running\s+2\s+45%\s+9000/20000\s+12.5 steps/s \(v100\)\s+host-1 \[0, 1\]\s+1$", row
    )
    assert "job-9f8e7d6c failed: exited with code 1: ZeroDivisionError" in text
    assert "  ZeroDivisionError: division by zero" in text
    html = status._repr_html_()
    assert "<th>progress</th>" in html
    assert "width: 45%" in html
    assert "<pre>Traceback (most recent call last):\nZeroDivisionError" in html
    assert (
        "<script"
        not in JobsStatus.from_json({"jobs": [{**QUEUED, "name": "<script>"}]})._repr_html_()
    )


def test_an_empty_queue_says_none():
    assert repr(JobsStatus.from_json({"policy": "fifo", "jobs": []})).endswith("(none)")


def test_one_jobs_view_gives_its_details_and_a_failed_ones_log():
    text = repr(Job.from_json(CRASHED))
    assert "job job-9f8e7d6c · broken" in text
    assert "finished" not in text  # finished_at is null in the record
    assert "error\nexited with code 1" in text
    assert "log tail" in text
    assert "log tail" not in repr(Job.from_json(RUNNING))


def test_logs_policy_and_simulation_show_what_the_gateway_said():
    logs = JobLogs.from_json({"id": "job-1", "lines": ["a", "b"]})
    assert repr(logs) == "a\nb"
    assert repr(JobLogs.from_json({"id": "job-1", "lines": []})) == "job-1: no output yet"
    policy = JobPolicy.from_json({"policy": "fifo", "available": ["fifo", "shockwave"]})
    assert repr(policy) == "job policy: fifo\navailable: fifo, shockwave"
    simulation = Simulation.from_json(
        {
            "policies": {
                "fifo": {
                    "avg_jct_s": 7200.0,
                    "makespan_s": 90.0,
                    "utilisation": 0.5,
                    "ftf_rho": {"median": 1.0, "p75": 1.5, "max": 2.25, "unfair_share": 0.1},
                    "jobs": 3,
                }
            }
        }
    )
    assert simulation["fifo"].ftf_rho["max"] == 2.25
    header, row = repr(simulation).splitlines()[-2:]
    assert header.split("  ") == [
        "policy",
        "jobs",
        "avg JCT",
        "makespan",
        "utilisation",
        "rho median",
        "rho max",
    ]
    assert row.split() == ["fifo", "3", "2.00", "h", "90", "s", "50%", "1.00", "2.25"]
    with pytest.raises(KeyError):
        simulation["shockwave"]


def test_a_script_is_sent_as_its_text_with_its_argv(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    body = submission(script, gpus=2, steps=100, args=["--lr", 0.1])  # type: ignore[list-item]
    assert body == {
        "gpus": 2,
        "steps": 100,
        "source": "print('hi')\n",
        "name": "train",
        "args": ["--lr", "0.1"],
    }
    named = submission(str(script), gpus=1, steps=1, name="mine", weight=2.5)
    assert (named["name"], named["weight"], "args" in named) == ("mine", 2.5, False)
    with pytest.raises(FileNotFoundError):
        submission(tmp_path / "missing.py", gpus=1, steps=1)


def test_a_function_is_sent_pickled_by_value_and_takes_no_argv():
    offset = 40

    def answer() -> int:
        return offset + 2

    body = submission(answer, gpus=1, steps=5)
    assert body["name"] == "answer"
    assert "source" not in body
    assert cloudpickle.loads(base64.b64decode(body["function"]))() == 42
    with pytest.raises(ValueError, match="function takes none"):
        submission(answer, gpus=1, steps=5, args=["x"])


def test_short_ids_resolve_while_one_job_matches():
    ids = ["job-1a2b3c4d", "job-1a2b0000", "job-9f8e7d6c"]
    assert match_job_id("job-9f8e7d6c", ids) == "job-9f8e7d6c"
    assert match_job_id("9f", ids) == "job-9f8e7d6c"
    assert match_job_id("job-1a2b3", ids) == "job-1a2b3c4d"
    assert match_job_id("nope", ids) == "nope"  # the gateway then names it unknown
    with pytest.raises(AmbiguousJobId, match=r"'1a2b' is the start of 2 job ids"):
        match_job_id("1a2b", ids)


def test_text_tables_align_columns():
    assert text_table(("a", "bb"), [("ccc", "d")]) == ["a    bb", "ccc  d"]
    assert text_table(("a",), []) == ["a", "(none)"]


def test_a_simulation_of_an_empty_queue_says_so_instead_of_a_table_of_zeros():
    empty = {"avg_jct_s": 0.0, "makespan_s": 0.0, "utilisation": 0.0, "jobs": 0}
    empty["ftf_rho"] = {"median": 0.0, "p75": 0.0, "max": 0.0, "unfair_share": 0.0}
    text = repr(Simulation.from_json({"policies": {"fifo": empty, "shockwave": empty}}))
    assert "nothing to replay" in text
    assert "avg JCT" not in text
