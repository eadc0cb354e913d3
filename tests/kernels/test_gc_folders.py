"""Replica folders do not outlive their replicas: a stopped replica's folder is removed once
its process is reaped, and an agent that starts removes the folders no running process uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelfleet.kernels.agent.kernel_process import (
    KERNEL_LOG,
    remove_replica_folder,
    replica_dirs_in_use,
    sweep_replica_folders,
)
from kernelfleet.testing import wait_for

DAY = 86400.0


def replica_folder(root: Path, name: str, log_age_s: float = 0.0) -> Path:
    """A folder laid out as a replica's: kernel.log, connection file, home, raft journal."""
    folder = root / name
    (folder / "home" / "tmp").mkdir(parents=True)
    (folder / "raft").mkdir()
    (folder / "raft" / "raft.journal").write_bytes(b"j" * 100)
    (folder / "connection.json").write_text("{}")
    (folder / KERNEL_LOG).write_text("log\n")
    stamp = time.time() - log_age_s
    os.utime(folder / KERNEL_LOG, (stamp, stamp))
    return folder


def test_a_removed_folder_is_gone_even_where_the_kernel_made_it_read_only(tmp_path):
    folder = replica_folder(tmp_path, "r1")
    (folder / "home" / "locked").mkdir()
    (folder / "home" / "locked" / "file").write_text("x")
    (folder / "home" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("not the replica's")
    (folder / "home" / "locked").chmod(0o500)
    remove_replica_folder(folder)
    assert not folder.exists()
    assert (tmp_path / "outside" / "keep.txt").read_text() == "not the replica's"


def test_keep_log_leaves_only_kernel_log(tmp_path):
    folder = replica_folder(tmp_path, "r1")
    remove_replica_folder(folder, keep_log=True)
    assert sorted(p.name for p in folder.iterdir()) == [KERNEL_LOG]


def test_the_sweep_removes_folders_of_replicas_no_process_runs(tmp_path):
    mine = replica_folder(tmp_path, "mine")
    running = replica_folder(tmp_path, "running")
    stale = replica_folder(tmp_path, "stale")
    removed = sweep_replica_folders(tmp_path, keep={"mine"}, in_use={str(running)})
    assert removed == ["stale"]
    assert mine.exists()
    assert running.exists()
    assert not stale.exists()


def test_the_sweep_while_the_agent_runs_spares_folders_made_just_now(tmp_path):
    starting = replica_folder(tmp_path, "starting")
    stale = replica_folder(tmp_path, "stale")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    assert sweep_replica_folders(tmp_path, in_use=set(), min_age_s=60) == ["stale"]
    assert starting.exists()


def test_the_sweep_keeps_recent_logs_for_the_configured_days_only(tmp_path):
    recent = replica_folder(tmp_path, "recent", log_age_s=0.5 * DAY)
    old = replica_folder(tmp_path, "old", log_age_s=3 * DAY)
    sweep_replica_folders(tmp_path, in_use=set(), keep_logs_s=2 * DAY)
    assert sorted(p.name for p in recent.iterdir()) == [KERNEL_LOG]
    assert not old.exists()
    assert sweep_replica_folders(tmp_path, in_use=set(), keep_logs_s=2 * DAY) == []
    assert recent.exists()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_a_folder_a_running_process_points_to_is_in_use(tmp_path):
    folder = tmp_path / "r-live"
    env = {**os.environ, "KERNELFLEET_REPLICA_DIR": str(folder)}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        wait_for(lambda: str(folder) in replica_dirs_in_use(), 10, "the child's environment")
    finally:
        child.kill()
        child.wait()
    assert str(folder) not in replica_dirs_in_use()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_starting_and_stopping_kernels_leaves_no_replica_folder(fleet_factory):
    fleet = fleet_factory(hosts=3, gpus=1, replicas=3)
    folders = [fleet.state_dir / f"host-{n}" / "replicas" for n in (1, 2, 3)]
    for n in range(3):
        kernel_id = fleet.start_kernel()
        client = await fleet.connect(kernel_id)
        try:
            assert (await client.execute(f"x = {n}; print(x)")).stdout == f"{n}\n"
        finally:
            client.close()
        assert all(any(folder.iterdir()) for folder in folders), "each host ran a replica"
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    wait_for(
        lambda: not any(any(folder.iterdir()) for folder in folders),
        20,
        "every replica folder to be removed",
    )


@pytest.mark.slow
async def test_a_stopped_replica_keeps_only_its_log_when_logs_are_kept(tmp_path):
    from jupyter_client.kernelspec import KernelSpecManager

    from kernelfleet.kernels.agent.replicas import ReplicaRequest, ReplicaTable

    table = ReplicaTable(
        state_dir=tmp_path,
        kernel_spec_manager=KernelSpecManager(),
        root_dir=tmp_path,
        keep_logs_for=DAY,
    )
    try:
        replica = await table.start(ReplicaRequest("kept", "k", "python3"))
        assert (replica.directory / "connection.json").exists()
        await table.stop("kept")
        assert sorted(p.name for p in replica.directory.iterdir()) == [KERNEL_LOG]
        assert "launching replica kept" in (replica.directory / KERNEL_LOG).read_text()
        table.keep_logs_for = 0
        replica = await table.start(ReplicaRequest("gone", "k", "python3"))
        await table.stop("gone")
        assert not replica.directory.exists()
    finally:
        await table.stop_all(grace=5)
