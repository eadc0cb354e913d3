"""The host agent's job table with real processes: launch on the leased devices, log capture,
stop with a grace period then SIGKILL, and adoption by an agent started again."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from kernelfleet.errors import Conflict, InvalidRequest
from kernelfleet.kernels.agent.jobs import JobRequest, JobTable
from kernelfleet.kernels.agent.kernel_process import Isolation

SAME_USER = Isolation(False, "tests run jobs as their own user")
OBEDIENT = "import signal, sys, time\nprint('on', __import__('os').environ['CUDA_VISIBLE_DEVICES'], flush=True)\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(60)\n"  # noqa: E501
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"  # noqa: E501


def request(job_id, source, devices=("1",)):
    return JobRequest.from_json({"job_id": job_id, "devices": list(devices), "source": source,
                                 "env": {"X": "1"}})  # fmt: skip


async def wait_log(job, text, timeout=10.0):
    for _ in range(int(timeout / 0.05)):
        if text in "\n".join(job.log_tail()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} not in {job.log_tail()}")


async def test_a_job_runs_on_its_devices_and_stops_on_sigterm(tmp_path):
    changes = []
    table = JobTable(tmp_path, SAME_USER, on_change=lambda: changes.append(1))
    job = await table.start(request("job-a", OBEDIENT, ("0", "2")))
    await wait_log(job, "on 0,2")
    with pytest.raises(Conflict):
        await table.start(request("job-a", OBEDIENT))
    stopped = await table.stop("job-a", grace=10)
    assert (stopped.exit_code, stopped.killed, stopped.stop_requested) == (0, False, True)
    assert table.models()[0]["state"] == "exited"
    assert len(changes) >= 2, "start and exit each beat at once"
    table.forget("job-a")
    assert table.models() == []
    assert not (tmp_path / "jobs" / "job-a").exists()


async def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    table = JobTable(tmp_path, SAME_USER)
    job = await table.start(request("job-b", STUBBORN))
    await wait_log(job, "ready")
    started = asyncio.get_running_loop().time()
    stopped = await table.stop("job-b", grace=0.5)
    assert stopped.killed
    assert stopped.exit_code == -signal.SIGKILL
    assert asyncio.get_running_loop().time() - started < 5


async def test_an_agent_started_again_adopts_the_jobs_still_running(tmp_path):
    first = JobTable(tmp_path, SAME_USER)
    job = await first.start(request("job-c", OBEDIENT))
    await wait_log(job, "on 1")
    second = JobTable(tmp_path, SAME_USER)
    assert second.adopt() == ["job-c"]
    assert second.get("job-c").model()["state"] == "running"
    os.killpg(job.pid, signal.SIGTERM)
    await first.get("job-c").done.wait()  # reaped by the table that started it
    await asyncio.wait_for(second.get("job-c").done.wait(), 5)
    assert second.get("job-c").exit_code is None, "not its child: the code is unknown"


def test_a_bad_job_request_is_refused():
    with pytest.raises(InvalidRequest):
        JobRequest.from_json({"job_id": "../x", "devices": [], "source": "x"})
    with pytest.raises(InvalidRequest):
        JobRequest.from_json({"job_id": "job-1", "devices": [0], "source": "x"})
    with pytest.raises(InvalidRequest):
        JobRequest.from_json({"job_id": "job-1", "devices": [], "function": "%%"})


class _RootCollision(Isolation):
    """Per-job users whose derived uid happens to be a system account's (root's, here)."""

    def owner(self, kernel_id):
        return 0, 0


async def test_a_job_whose_uid_is_a_system_account_is_refused(tmp_path):
    table = JobTable(tmp_path, _RootCollision(True, "per-job users"))
    with pytest.raises(Conflict, match="uid 0, which is the system account 'root'"):
        await table.start(request("job-r", OBEDIENT))
    assert table.models() == []
