"""A background job that uses CheckFreq over its checkpoint folder loses no step when it is asked
to stop: it checkpoints at once, and the run resumed from that checkpoint gives the same losses and
batches as one never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kernelfleet.protocol import JobEnv
from tests.tools.test_checkfreq_kill import REPO_ROOT, steps

STEPS = 40


def job_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    return {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        JobEnv.JOB_ID.value: "job-cf000001",
        JobEnv.STEPS.value: str(STEPS),
        JobEnv.CHECKPOINT.value: str(folder),  # no gateway: reports stay in the process
    }


def start(folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.tools.checkfreq_job"],
        cwd=REPO_ROOT,
        env=job_env(folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_stopped_job_checkpoints_at_once_and_resumes_where_it_stopped(tmp_path):
    full = subprocess.run(
        [sys.executable, "-m", "tests.tools.checkfreq_job"],
        cwd=REPO_ROOT,
        env=job_env(tmp_path / "full"),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert full.returncode == 0, full.stderr
    expected = steps(full.stdout)
    assert sorted(expected) == list(range(1, STEPS + 1))

    job = start(tmp_path / "job")
    assert job.stdout is not None
    lines = []
    for line in job.stdout:
        lines.append(line)
        if line.startswith("12 "):
            job.send_signal(signal.SIGTERM)  # what the agent does to preempt a job
    assert job.wait(timeout=60) == 0, job.stderr.read() if job.stderr else ""
    stopped = "".join(lines)
    stopped_at = int(stopped.split("stopped at ", 1)[1].split()[0])
    assert max(steps(stopped)) == stopped_at  # the checkpoint is of the last step done: none lost

    resumed = subprocess.run(
        [sys.executable, "-m", "tests.tools.checkfreq_job"],
        cwd=REPO_ROOT,
        env=job_env(tmp_path / "job"),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at {stopped_at}\n" in resumed.stdout
    got = {**steps(stopped), **steps(resumed.stdout)}
    assert [s for s in expected if got[s] != expected[s]] == []
    assert (tmp_path / "job" / "latest.json").is_file()  # the SDK's pointer, for the gateway
