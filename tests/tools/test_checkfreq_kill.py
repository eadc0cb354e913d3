"""The acceptance test: a seeded CPU training loop killed with SIGKILL at a random step and
resumed from its checkpoints gives the same losses and the same batch order as a run that was
never interrupted; and a checkpoint folder that fills up mid-training is told once, leaves no
half-written checkpoint, and training goes on."""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kernelfleet

REPO_ROOT = Path(kernelfleet.__file__).resolve().parent.parent
STEPS = 40


def run(directory: Path, *args: str, preexec=None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "tests.tools.checkfreq_train", str(directory), str(STEPS)]
    return subprocess.run(
        [*command, "-", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        preexec_fn=preexec,
    )


def steps(stdout: str) -> dict[int, str]:
    """step -> its line (a later line for the same step wins: the resumed run's)."""
    found = {}
    for line in stdout.splitlines():
        first = line.split(" ", 1)[0]
        if first.isdigit():
            found[int(first)] = line
    return found


@pytest.mark.slow
def test_a_run_killed_at_a_random_step_resumes_to_the_same_losses_and_batches(tmp_path):
    full = run(tmp_path / "full")
    assert full.returncode == 0, full.stderr
    expected = steps(full.stdout)
    assert sorted(expected) == list(range(1, STEPS + 1))

    kill_at = random.Random().randrange(8, STEPS - 2)
    killed = run(tmp_path / "ck", "--kill-at", str(kill_at))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = steps(killed.stdout)
    assert max(before) == kill_at
    resumed = run(tmp_path / "ck", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    resumed_at = int(resumed.stdout.split("resumed at ", 1)[1].split()[0])
    assert 4 <= resumed_at <= kill_at, f"killed at {kill_at}"  # the first checkpoint is step 4
    after = steps(resumed.stdout)
    assert sorted(after) == list(range(resumed_at + 1, STEPS + 1))
    got = {**before, **after}
    differing = [s for s in expected if got[s] != expected[s]]
    assert differing == [], f"killed at {kill_at}, resumed at {resumed_at}"


def no_bigger_files_than(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.slow
def test_a_full_folder_is_told_once_and_leaves_no_half_checkpoint(tmp_path):
    # the model's checkpoint file is larger than this: every write of one fails part-way
    result = run(tmp_path / "ck", preexec=no_bigger_files_than(1500))
    assert result.returncode == 0, result.stderr
    assert sorted(steps(result.stdout)) == list(range(1, STEPS + 1))  # training went on
    told = [line for line in result.stderr.splitlines() if line.startswith("checkfreq:")]
    assert len(told) == 1, result.stderr
    assert "not written: File too large" in told[0]
    assert "training goes on" in told[0]
    assert "checkpointed None" in result.stdout
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == []  # nothing half-written
