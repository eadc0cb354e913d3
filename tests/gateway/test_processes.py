"""`kernelfleet.gateway.processes`: liveness of a pid, and reading a host agent's runtime file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernelfleet.gateway.processes import pid_alive, read_agent_runtime
from kernelfleet.protocol import AGENT_RUNTIME_FILE, AgentRuntime
from kernelfleet.testing import exited_pid


def write_runtime(state_dir: Path, **fields: object) -> None:
    runtime = {"host_id": "h1", "address": "http://127.0.0.1:9", "port": 9, "pid": os.getpid()}
    (state_dir / AGENT_RUNTIME_FILE).write_text(json.dumps({**runtime, **fields}))


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
    write_runtime(tmp_path)
    expected = AgentRuntime("h1", "http://127.0.0.1:9", 9, os.getpid())
    assert read_agent_runtime(tmp_path) == expected
    assert read_agent_runtime(tmp_path, pid=os.getpid()) == expected


def test_a_stale_runtime_file_is_not_a_live_agent(tmp_path: Path) -> None:
    write_runtime(tmp_path, pid=exited_pid())
    assert read_agent_runtime(tmp_path) is None


def test_a_runtime_file_of_another_process_is_not_the_awaited_agent(tmp_path: Path) -> None:
    write_runtime(tmp_path)  # this process runs, but it is not the agent we started
    assert read_agent_runtime(tmp_path, pid=exited_pid()) is None


def test_a_missing_or_unreadable_runtime_file_reads_as_none(tmp_path: Path) -> None:
    assert read_agent_runtime(tmp_path) is None
    for text in ("", "{", "[]", '{"host_id": "h1"}', '{"host_id": "h1", "address": "a", '
                 '"port": "not a number", "pid": 1}'):  # fmt: skip
        (tmp_path / AGENT_RUNTIME_FILE).write_text(text)
        assert read_agent_runtime(tmp_path) is None, text
