"""`kernelfleet.runtime_file`: liveness of a pid; writing, reading and removing a runtime file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kernelfleet.gateway.processes import kill_group, spawn_kernelfleet
from kernelfleet.runtime_file import (
    RUNTIME_FILE,
    AgentRuntime,
    GatewayRuntime,
    pid_alive,
    read_runtime,
    remove_runtime,
    write_runtime,
)
from kernelfleet.testing import call_json, exited_pid, wait_for


def write_agent_file(state_dir: Path, **fields: object) -> None:
    runtime = {"host_id": "h1", "address": "http://127.0.0.1:9", "port": 9, "pid": os.getpid()}
    (state_dir / RUNTIME_FILE).write_text(json.dumps({**runtime, **fields}))


def test_pid_alive_tells_running_exited_and_unreaped_processes_apart() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(exited_pid())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, still unreaped
        assert not pid_alive(zombie.pid)
    finally:
        zombie.wait()


def test_a_runtime_file_of_a_running_process_is_read(tmp_path: Path) -> None:
    write_agent_file(tmp_path)
    expected = AgentRuntime("h1", "http://127.0.0.1:9", 9, os.getpid())
    assert read_runtime(tmp_path, AgentRuntime) == expected
    assert read_runtime(tmp_path, AgentRuntime, pid=os.getpid()) == expected


def test_a_stale_runtime_file_is_not_a_live_agent(tmp_path: Path) -> None:
    write_agent_file(tmp_path, pid=exited_pid())
    assert read_runtime(tmp_path, AgentRuntime) is None


def test_a_runtime_file_of_another_process_is_not_the_awaited_agent(tmp_path: Path) -> None:
    write_agent_file(tmp_path)  # this process runs, but it is not the agent we started
    assert read_runtime(tmp_path, AgentRuntime, pid=exited_pid()) is None


def test_a_missing_or_unreadable_runtime_file_reads_as_none(tmp_path: Path) -> None:
    assert read_runtime(tmp_path, AgentRuntime) is None
    for text in ("", "{", "[]", '{"host_id": "h1"}', '{"host_id": "h1", "address": "a", '
                 '"port": "not a number", "pid": 1}'):  # fmt: skip
        (tmp_path / RUNTIME_FILE).write_text(text)
        assert read_runtime(tmp_path, AgentRuntime) is None, text


def test_a_written_runtime_reads_back_and_only_its_writer_removes_it(tmp_path: Path) -> None:
    mine = GatewayRuntime("http://127.0.0.1:9", 9, os.getpid())
    path = write_runtime(tmp_path, mine)
    assert path == tmp_path / RUNTIME_FILE
    assert not list(tmp_path.glob(f".{RUNTIME_FILE}*")), "nothing left aside"
    assert read_runtime(tmp_path, GatewayRuntime) == mine
    assert read_runtime(tmp_path, AgentRuntime) is None, "a gateway's file is no agent's"

    write_runtime(tmp_path, GatewayRuntime("http://127.0.0.1:9", 9, exited_pid()))
    remove_runtime(tmp_path)
    assert path.exists(), "another process's file is left alone"
    write_runtime(tmp_path, mine)
    remove_runtime(tmp_path)
    assert not path.exists()


def test_a_gateway_writes_its_runtime_file_once_it_listens_and_removes_it_on_a_clean_stop(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "gateway"
    gateway = spawn_kernelfleet(
        ["gateway", "--port", "0", "--state-dir", str(state_dir)], tmp_path / "gw.log", "t0ken"
    )
    try:
        runtime = wait_for(
            lambda: read_runtime(state_dir, GatewayRuntime, gateway.pid), 30, "its runtime file"
        )
        assert runtime.port > 0
        assert runtime.url == f"http://127.0.0.1:{runtime.port}"
        status, _ = call_json(runtime.url + "/api/kernelspecs", token="t0ken")
        assert status == 200, "it answers where its file says"
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(20) == 0
        assert not (state_dir / RUNTIME_FILE).exists()
    finally:
        kill_group(gateway)
