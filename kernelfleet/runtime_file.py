"""Runtime files: how a running gateway or host agent says that it listens, and where.

Once its HTTP API listens, each of them writes ``<state_dir>/runtime.json`` (`RUNTIME_FILE`), a
JSON object with the fields of `GatewayRuntime` or `AgentRuntime`, and removes it as it starts a
clean exit, as jupyter_server does with its server info file. Whoever started the process (the
gateway's host provider, ``kernelfleet up``, the tests) waits for the file instead of reading the
process's log.

The file appears whole: it is written aside, then renamed into place. A process that was killed
leaves its file behind, so `read_runtime` takes a file whose pid no longer runs for stale, never
for a live process. This module imports nothing from kernelfleet: both processes and every
reader use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, get_type_hints

RUNTIME_FILE = "runtime.json"


@dataclass(frozen=True)
class GatewayRuntime:
    """What a running gateway writes in its runtime file."""

    url: str
    """``http://<ip>:<port>``, where its API listens."""
    port: int
    """The port it listens on (the one it picked, for ``--port 0``)."""
    pid: int


@dataclass(frozen=True)
class AgentRuntime:
    """What a running host agent writes in its runtime file."""

    host_id: str
    address: str
    """The URL the gateway reaches the agent at (its ``--advertise-url``, else ip and port)."""
    port: int
    """The port its API listens on (the one it picked, for ``--port 0``)."""
    pid: int


Runtime = TypeVar("Runtime", GatewayRuntime, AgentRuntime)


def write_runtime(state_dir: str | Path, runtime: GatewayRuntime | AgentRuntime) -> Path:
    """Write `runtime` as ``<state_dir>/runtime.json`` in one rename; returns the path."""
    path = Path(state_dir) / RUNTIME_FILE
    aside = path.with_name(f".{RUNTIME_FILE}.{os.getpid()}")
    aside.write_text(json.dumps(dataclasses.asdict(runtime)) + "\n")
    os.replace(aside, path)
    return path


def remove_runtime(state_dir: str | Path) -> None:
    """Remove this process's runtime file, unless another process has put its own there."""
    path = Path(state_dir) / RUNTIME_FILE
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def read_runtime(
    state_dir: str | Path, kind: type[Runtime], pid: int | None = None
) -> Runtime | None:
    """The runtime file in `state_dir`, read as `kind`, if the process that wrote it runs.

    None while there is none (the process does not listen yet, or stopped cleanly), when the
    file does not parse as `kind`, when its pid no longer runs (a stale file: the process was
    killed), and, given `pid` (the process the caller started), when the file is another
    process's (an earlier one's in the same state dir). Never raises for what it finds there.
    """
    try:
        found = json.loads((Path(state_dir) / RUNTIME_FILE).read_text())
        types = get_type_hints(kind)
        runtime = kind(**{f.name: types[f.name](found[f.name]) for f in dataclasses.fields(kind)})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if pid is not None and runtime.pid != pid:
        return None
    return runtime if pid_alive(runtime.pid) else None


def pid_alive(pid: int) -> bool:
    """True while process `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to ask: os.kill found it
    return state != "Z"
