"""Ports and process trees for tests.

What production needs too lives in `kernelfleet.gateway.processes` (starting ``kernelfleet``
processes, stopping them, `pid_alive`, an agent's runtime file) and tests use it from there;
this module holds only what tests alone need.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def free_port(ip: str = "127.0.0.1") -> int:
    """A TCP port on `ip` that was free a moment ago (the system's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def exited_pid() -> int:
    """The pid of a process that has exited and been reaped: no process has it (until the
    system hands it out again, which takes a while)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def descendants(pid: int) -> list[int]:
    """The pids of every live process below `pid` (read from /proc), children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def kill_all(pids: Iterable[int], signum: int = signal.SIGKILL) -> None:
    """Send `signum` to every pid that still exists (stragglers a test leaves behind)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
