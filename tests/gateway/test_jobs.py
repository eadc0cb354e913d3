"""The jobs service's parts without processes: loans in the GPU ledger, submissions, records and
their state file, job tokens, throughputs learned online."""

from __future__ import annotations

import json

import pytest

from kernelfleet.errors import Conflict, InvalidRequest
from kernelfleet.gateway.jobs.planning import ThroughputMeter, assumed_throughputs, snapshot_of
from kernelfleet.gateway.jobs.records import JobLease, JobRecord, JobState
from kernelfleet.gateway.jobs.store import JobStore
from kernelfleet.gateway.jobs.submission import Submission
from kernelfleet.gateway.jobs.tokens import JobTokens
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.store import StateUnreadable
from kernelfleet.states import IllegalTransition


@pytest.fixture
def ledger():
    ledger = GpuLedger(checked=True)
    ledger.set_host("h", ["0", "1", "2"])
    ledger.subscribe("h", "k", "r", 1)
    return ledger


def test_devices_lent_to_jobs_are_free_for_cells_which_take_them_last(ledger):
    ledger.lend("h", ["0", "1"], "job-a")
    assert ledger.lendable("h") == ("2",)
    assert ledger.view("h").committed == 0, "cells and their policies see lent devices free"
    first = ledger.commit("h", "k", "r", "cell-1", 1)
    assert first.device_ids == ("2",), "a device lent to nobody first"
    assert first.preempted == ()
    ledger.release("k", cell_id="cell-1")
    ledger.subscribe("h", "k", "r", 2)
    second = ledger.commit("h", "k", "r", "cell-2", 2)
    assert second.preempted == ("job-a",), "the cell takes a lent device: the job must stop"
    assert ledger.lent("h") == {"1": "job-a"} or ledger.lent("h") == {"0": "job-a"}
    assert ledger.breaches == 0


def test_a_loan_is_refused_on_a_bound_or_borrowed_device_and_reclaim_ends_them(ledger):
    ledger.commit("h", "k", "r", "cell", 1)
    with pytest.raises(Conflict, match="bound to a cell"):
        ledger.lend("h", ["0"], "job-a")
    ledger.lend("h", ["1"], "job-a")
    ledger.lend("h", ["1"], "job-a")  # again: nothing changes
    with pytest.raises(Conflict, match="lent to job job-a"):
        ledger.lend("h", ["1"], "job-b")
    with pytest.raises(Conflict, match="no device 7"):
        ledger.lend("h", ["7"], "job-b")
    assert ledger.loans("job-a") == {"h": ("1",)}
    assert ledger.reclaim("job-a") == {"h": ("1",)}
    assert ledger.reclaim("job-a") == {}
    assert ledger.breaches == 0


def test_a_loan_on_a_device_the_host_no_longer_reports_ends(ledger):
    ledger.lend("h", ["2"], "job-a")
    ledger.set_host("h", ["0", "1"])
    assert ledger.lent("h") == {}
    assert ledger.breaches == 0


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"gpus": 1, "steps": 1}, "exactly one of"),
        ({"source": "x", "function": "eA==", "gpus": 1, "steps": 1}, "exactly one of"),
        ({"source": "x", "gpus": 0, "steps": 1}, "'gpus'"),
        ({"source": "x", "gpus": True, "steps": 1}, "'gpus'"),
        ({"source": "x", "gpus": 1, "steps": 1.5}, "'steps'"),
        ({"source": "x", "gpus": 1, "steps": 1, "weight": 0}, "'weight'"),
        ({"source": "x", "gpus": 1, "steps": 1, "weight": float("nan")}, "'weight'"),
        ({"function": "not base64!", "gpus": 1, "steps": 1}, "base64"),
        ({"source": "x", "gpus": 1, "steps": 1, "args": "a b"}, "'args'"),
        ({"source": "x", "gpus": 1, "steps": 1, "colour": "red"}, "unknown field"),
    ],
)
def test_a_bad_submission_names_its_field(body, complaint):
    with pytest.raises(InvalidRequest, match=complaint):
        Submission.from_json(body)


def test_a_good_submission():
    got = Submission.from_json({"source": "print(1)", "gpus": 2, "steps": 10, "weight": 2})
    assert (got.gpus, got.steps, got.weight, got.name) == (2, 10, 2.0, None)


def test_records_go_through_the_state_file_and_a_corrupt_one_is_refused(tmp_path):
    job = JobRecord("job-1", "train", gpus=1, steps=100, source="x", submitted_at=1.0)
    job.move_to(JobState.RUNNING)
    job.lease = JobLease("h", "v100", ("0",))
    job.throughput, job.steps_done, job.checkpoint_step = {"v100": 2.5}, 40, 30
    store = JobStore(tmp_path)
    store.save([job], "fifo")
    jobs, policy = store.load()
    assert policy == "fifo"
    assert jobs[0].model() == job.model()
    assert jobs[0].checkpoint_step == 30
    with pytest.raises(IllegalTransition):
        jobs[0].move_to(JobState.CANCELLED)  # a running job is stopped first
    stored = json.loads(store.path.read_text())
    stored["jobs"][0]["state"] = "sleeping"
    store.path.write_text(json.dumps(stored))
    with pytest.raises(StateUnreadable, match=r"jobs\.json"):
        store.load()
    assert JobStore(tmp_path / "none").load() == ([], None)


def test_a_job_token_is_its_jobs_alone_and_no_kernel_token():
    tokens = JobTokens("fleet-token-123456")
    token = tokens.issue("job-1")
    assert tokens.verify(token, "job-1")
    assert not tokens.verify(token, "job-2")
    assert not JobTokens("another-fleet-token").verify(token, "job-1")
    assert KernelTokens("fleet-token-123456").verify(token) is None


def test_throughputs_are_learned_from_reports_and_assumed_where_unmeasured():
    meter = ThroughputMeter()
    meter.started(0, now=0.0)
    assert meter.report("v100", 10, now=0.1) is None, "too soon to tell"
    assert meter.report("v100", 20, now=2.0) == pytest.approx(10.0)
    assert meter.report("v100", 60, now=4.0) == pytest.approx(0.5 * 20 + 0.5 * 10)
    assert meter.report("k80", 60, measured=3.0, now=4.1) == 3.0, "the job's own figure"
    assert assumed_throughputs({"v100": 4.0}, ["v100", "k80"]) == {"v100": 4.0, "k80": 4.0}
    assert assumed_throughputs({}, ["k80"]) == {"k80": 1.0}


def test_the_snapshot_holds_the_jobs_that_want_gpus():
    jobs = [JobRecord(f"job-{i}", "t", gpus=1, steps=10, source="x") for i in range(3)]
    jobs[1].move_to(JobState.RUNNING)
    jobs[2].move_to(JobState.CANCELLED)
    snapshot = snapshot_of(jobs, {"v100": 2}, 60.0, now=100.0)
    assert [view.job_id for view in snapshot.jobs] == ["job-0", "job-1"]
    assert snapshot.cluster == {"v100": 2}
    assert snapshot.jobs[0].throughputs == {"v100": 1.0}
