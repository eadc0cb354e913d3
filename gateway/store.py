"""The gateway's durable state: its kernels, so a restarted gateway finds them again.

Hosts need no storing: their agents re-register with their next heartbeat. Kernels are written
as JSON after every change, atomically (a temporary file renamed over the old one), so a crash
never leaves a torn file. A file that cannot be read all the same (edited by hand, a disk
fault, another program's) is `StateUnreadable`: the gateway stops rather than start empty and
lose track of kernels still running; the operator decides what to do with the file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.errors import FleetError

log = logging.getLogger("kernelfleet.gateway.store")

FORMAT_VERSION = 1


class StateUnreadable(FleetError):
    """A state file exists but cannot be read; the message names the file and what is wrong."""

    reason = "state-unreadable"


Replicate = Callable[[str, bytes], None]
"""Commits a file's new content (its path relative to the mirrored folder, its bytes) to
wherever it is replicated; raises if it cannot."""

_mirrored: tuple[Path, Replicate] | None = None


def mirror_writes(root: Path, replicate: Replicate) -> None:
    """From now on, every `write_json_atomically` under `root` calls `replicate` first and
    writes the file only once that returned (an exception from it propagates, and the file is
    left as it was). One folder per process: a replicated gateway's state folder
    (`kernelfleet.gateway.membership`)."""
    global _mirrored
    _mirrored = (Path(root).resolve(), replicate)


def stop_mirroring() -> None:
    """Undo `mirror_writes`: later writes are local only."""
    global _mirrored
    _mirrored = None


def write_json_atomically(path: Path, data: Any, mode: int = 0o600) -> None:
    """Write `data` as JSON to `path` through a temporary file renamed over it (never torn),
    readable by its owner only (`mode`); replicated first where `mirror_writes` says so."""
    text = json.dumps(data, indent=1).encode()
    if _mirrored is not None:
        root, replicate = _mirrored
        resolved = Path(path).resolve()
        if resolved.is_relative_to(root):
            replicate(str(resolved.relative_to(root)), text)
    write_bytes_atomically(path, text, mode)


def write_bytes_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` through a temporary file renamed over it (never torn), readable
    by its owner only (`mode`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_json_list(path: Path, key: str) -> list[Any]:
    """The list under `key` of a version `FORMAT_VERSION` JSON file written by
    `write_json_atomically` as ``{"version", key: [...]}``; ``[]`` when there is no file.
    `StateUnreadable` naming `path` for anything else (truncated, not JSON, wrong shape); the
    file is left as it is."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise StateUnreadable(f"cannot read the state file {path}: {e}") from e
    try:
        stored = json.loads(text)
        if not isinstance(stored, dict) or stored.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a version {FORMAT_VERSION} state file")
        if not isinstance(stored.get(key), list):
            raise ValueError(f"no '{key}' list")
        return list(stored[key])
    except ValueError as e:
        raise StateUnreadable(
            f"the state file {path} is corrupt or truncated ({e}); the gateway will not start "
            "without it, as it would lose track of kernels still running: restore it, or "
            "remove it to start with no kernels"
        ) from e


class KernelStore:
    """Reads and writes ``<state_dir>/kernels.json``."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "kernels.json"

    def save(self, kernels: list[dict[str, Any]]) -> None:
        write_json_atomically(self.path, {"version": FORMAT_VERSION, "kernels": kernels})

    def load(self) -> list[dict[str, Any]]:
        """The stored kernels (``[]`` with no file); `StateUnreadable` for a file that cannot
        be read, or whose kernels are not JSON objects."""
        kernels = read_json_list(self.path, "kernels")
        if not all(isinstance(kernel, dict) for kernel in kernels):
            raise StateUnreadable(
                f"the state file {self.path} holds a kernel that is not a JSON object"
            )
        return kernels
