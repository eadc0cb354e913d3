"""Local kernelfleet processes (a gateway, host agents), as ``kernelfleet up`` and the local host
provider start and stop them.

Each runs as ``python -m kernelfleet ...`` in its own session (so a signal to its process
group reaches its kernels too), with stdout and stderr appended to a log file. The token
travels in the environment, never on a command line, where ``ps`` would show it. A process
says that it listens, and where, in its runtime file (`kernelfleet.runtime_file`); nothing
here reads a log to learn that. Logs are created 0600: a host agent's log quotes its kernels'
output, which the kernels of other users must not read.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def spawn_kernelfleet(
    args: Sequence[str],
    log_path: Path,
    token: str,
    env: Mapping[str, str] | None = None,
    launcher: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``python -m kernelfleet ARGS`` in a new session, logging to `log_path`; `env` adds
    to this process's environment. `launcher` is a command that runs it, as ``ip netns exec
    NAME`` does in a network namespace (the process's pid is then the launcher's)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    environment = {
        **os.environ,
        **(env or {}),
        "KERNELFLEET_TOKEN": token,
        "PYTHONUNBUFFERED": "1",
    }
    with open(fd, "ab") as log_file:
        return subprocess.Popen(
            [*launcher, sys.executable, "-m", "kernelfleet", *args],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )


def host_agent_args(
    gateway_url: str, host_id: str, gpus: int, state_dir: Path | str, *extra: str
) -> list[str]:
    """The arguments of a ``kernelfleet host`` with `gpus` virtual GPUs and its own state."""
    return [
        "host", "--gateway", gateway_url, "--host-id", host_id,
        "--gpus", str(gpus), "--state-dir", str(state_dir), *extra,
    ]  # fmt: skip


def terminate(processes: Iterable[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM every process still running, then wait for them all, `timeout` seconds at most
    in total. Whatever still runs afterwards is the caller's to kill (`kill_group`)."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process's whole session (stragglers and orphaned children) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def log_tail(log_path: Path, lines: int = 8) -> str:
    """The last `lines` lines of a log file ("" if it does not exist)."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
