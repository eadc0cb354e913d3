"""``kernelfleet up`` for tests: the one command a user runs, as a subprocess.

`start_up` runs ``python -m kernelfleet up`` (started as `kernelfleet.gateway.processes` starts
every kernelfleet process: its own session, the token in its environment, output to a log) in a
folder of its own, and waits for the line it prints once its gateway answers and all its hosts
are alive: ``kernelfleet is up: URL token=TOKEN ...``. The `Up` it returns has that URL and token
(read from the line, as a user reads them) and the gateway's API; `Up.stop` sends SIGTERM, as
Ctrl-C would, and kills whatever is left in the process tree after a grace period.
"""

from __future__ import annotations

import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.gateway.processes import kill_group, spawn_kernelfleet
from kernelfleet.testing.deadlines import wait_for
from kernelfleet.testing.http import call_json
from kernelfleet.testing.processes import descendants, free_port, kill_all

UP_LINE = re.compile(r"kernelfleet is up: (?P<url>http://\S+) token=(?P<token>\S+)")


@dataclass
class Up:
    """A running ``kernelfleet up`` and the URL and token it printed."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    url: str = ""
    token: str = ""

    @property
    def log_path(self) -> Path:
        """The command's own output (``<state_dir>/up.log``); the gateway's and the hosts'
        logs are in ``<state_dir>/logs/``."""
        return self.state_dir / "up.log"

    def log(self, label: str = "up") -> str:
        """The command's output (`label` ``"up"``) or the log of one of its processes
        (``"gateway"``, ``"host-1"``...)."""
        path = self.log_path if label == "up" else self.state_dir / "logs" / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the gateway with the token; (status, parsed JSON body or None)."""
        return call_json(self.url + path, method, self.token, body)

    def api(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, payload = self.request(method, path, body)
        assert status == expect, f"{method} {path}: {status} {payload}"
        return payload

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (``kernelfleet up`` stops its gateway, then its hosts and their kernels);
        after `timeout` s, SIGKILL to everything still under it. Its exit code (None if it
        had to be killed)."""
        below = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
            self.process.wait()
            return None
        finally:
            kill_all(below)


def start_up(
    state_dir: Path,
    *args: str,
    token: str,
    timeout: float = 90.0,
) -> Up:
    """``kernelfleet up --port FREE --state-dir STATE_DIR ARGS`` (``--hosts 1``, say) with
    `token` in its environment, once it says it is up; the test fails with its output if it
    exits first or does not say so within `timeout` s."""
    state_dir.mkdir(parents=True, exist_ok=True)
    command = ["up", "--port", str(free_port()), "--state-dir", str(state_dir), *args]
    up = Up(spawn_kernelfleet(command, state_dir / "up.log", token), state_dir)

    def said_up() -> bool:
        found = UP_LINE.search(up.log())
        if found:
            up.url, up.token = found["url"], found["token"]
            return True
        if up.process.poll() is not None:
            pytest.fail(f"kernelfleet up exited with {up.process.returncode}:\n{up.log()[-4000:]}")
        return False

    try:
        wait_for(said_up, timeout, "kernelfleet up to say it is up", interval=0.2)
    except BaseException:
        up.stop(5)
        raise
    return up
