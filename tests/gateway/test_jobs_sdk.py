"""The job-process SDK (`kernelfleet.jobs.sdk`) in this process: checkpoints in an object store
folder, the stop request, reports that never raise."""

from __future__ import annotations

import pytest

from kernelfleet.jobs.sdk import POINTER, Job
from kernelfleet.protocol import JobEnv


@pytest.fixture
def job(tmp_path):
    return Job(
        {
            JobEnv.JOB_ID.value: "job-1",
            JobEnv.STEPS.value: "100",
            JobEnv.CHECKPOINT.value: str(tmp_path / "job-1"),
            JobEnv.GATEWAY_URL.value: "http://127.0.0.1:9",  # nothing listens there
            JobEnv.JOB_TOKEN.value: "kfj1.job-1.x",
        }
    )


def test_checkpoints_round_trip_and_only_the_latest_object_stays(job, tmp_path):
    assert job.load_checkpoint() is None, "a fresh job has none"
    job.report(5)
    job.save_checkpoint({"step": 5, "w": [1.0, 2.0]})
    job.save_checkpoint({"step": 7, "w": [3.0]}, step=7)
    assert job.load_checkpoint() == {"step": 7, "w": [3.0]}
    folder = tmp_path / "job-1"
    assert (folder / POINTER).exists()
    assert len(list((folder / "objects").glob("*/*"))) == 1, "the older object was removed"
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_stop_request_sets_should_stop_and_runs_the_callbacks_once(job):
    called = []
    job.on_stop(lambda: called.append("first"))
    job.on_stop(lambda: 1 / 0)  # a failing callback does not stop the others
    job.on_stop(lambda: called.append("second"))
    assert not job.should_stop
    job.request_stop()
    job.request_stop()
    assert job.should_stop
    assert called == ["first", "second"]
    job.on_stop(lambda: called.append("late"))
    assert called[-1] == "late", "a callback registered after the request runs at once"


def test_reports_to_an_unreachable_gateway_never_raise_and_are_kept(job):
    job.report(3, throughput=2.0)
    job.flush()
    job.report(4)
    job.flush()
    assert job._pending == {"steps_done": 4, "throughput": 2.0}, "newest values win"
