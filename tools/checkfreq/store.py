"""Where checkpoints live, and how one becomes visible only when it is complete.

Layout of a checkpoint folder::

    <directory>/
      latest                       the name of the newest complete checkpoint (one line)
      step-000000000120/           a complete checkpoint: torch.distributed.checkpoint's files
        .metadata, __0_0.distcp      (written and fsynced by its FileSystemWriter)
        checkfreq.json               the manifest: step, objects, settings (written last)
      .partial-step-...-<pid>/     one being written; never read

A checkpoint is written under a ``.partial-`` name, its manifest last, every file and the folder
fsynced, then renamed to its ``step-`` name (atomic on one filesystem) and the parent fsynced;
only then is ``latest`` replaced (a temporary file, fsynced, renamed over it). A writer killed at
any point leaves the previous checkpoint complete and ``latest`` naming it; `newest` also falls
back to the newest complete ``step-`` folder when ``latest`` is missing or names a broken one.
`prune` keeps the last `keep` complete checkpoints; `sweep_partials` removes what dead writers
left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from kernelfleet.tools.checkfreq.errors import CheckpointError

MANIFEST = "checkfreq.json"
POINTER = "latest"
PARTIAL_PREFIX = ".partial-"
FORMAT = 1
_STEP_RE = re.compile(r"step-(\d{12})")


def step_name(step: int) -> str:
    return f"step-{step:012d}"


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder: so a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one training run, in `directory` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def prepare(self) -> None:
        """Create the folder if needed and check that it can be written: raises
        `CheckpointError` when it cannot."""
        probe = self.directory / f".probe-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise CheckpointError(
                f"cannot write checkpoints to {self.directory}: {e.strerror}"
            ) from e
        self.sweep_partials()

    def begin(self, step: int) -> Path:
        """A new, empty partial folder for the checkpoint of `step` (raises `OSError`)."""
        partial = self.directory / f"{PARTIAL_PREFIX}{step_name(step)}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        return partial

    def commit(
        self, partial: Path, step: int, manifest: dict[str, Any], files: dict[str, bytes]
    ) -> Path:
        """Write `files`, then the manifest, into `partial`, make it durable, rename it to its
        step's name and point ``latest`` to it. Returns the final folder. Raises `OSError` (then
        `partial` is still partial: `discard` it)."""
        body = json.dumps({"format": FORMAT, "step": step, **manifest}, indent=1, sort_keys=True)
        for name, data in [*files.items(), (MANIFEST, body.encode())]:
            with open(partial / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_path(partial)
        final = self.directory / step_name(step)
        if final.exists():  # a run resumed from an older checkpoint reached this step again
            shutil.rmtree(final)
        os.replace(partial, final)
        fsync_path(self.directory)
        self._point_to(final.name)
        return final

    def _point_to(self, name: str) -> None:
        tmp = self.directory / f".{POINTER}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / POINTER)
        fsync_path(self.directory)

    def discard(self, partial: Path) -> None:
        shutil.rmtree(partial, ignore_errors=True)

    def complete(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        try:
            entries = list(self.directory.iterdir())
        except OSError:
            return []
        found = [p for p in entries if _STEP_RE.fullmatch(p.name) and self.is_complete(p)]
        return sorted(found, key=lambda p: p.name)

    @staticmethod
    def is_complete(path: Path) -> bool:
        return (path / MANIFEST).is_file() and (path / ".metadata").is_file()

    def newest(self) -> Path | None:
        """The checkpoint to resume from: the one ``latest`` names if complete, else the newest
        complete one; None when there is none."""
        with contextlib.suppress(OSError):
            named = (self.directory / POINTER).read_text().strip()
            if _STEP_RE.fullmatch(named) and self.is_complete(self.directory / named):
                return self.directory / named
        complete = self.complete()
        return complete[-1] if complete else None

    @staticmethod
    def manifest(path: Path) -> dict[str, Any]:
        try:
            found = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read the manifest of {path}: {e}") from e
        if not isinstance(found, dict) or found.get("format") != FORMAT:
            raise CheckpointError(f"{path} was written by another version of checkfreq")
        return found

    def prune(self) -> None:
        """Remove complete checkpoints beyond the newest `keep` (never the one ``latest`` names)."""
        newest = self.newest()
        for path in self.complete()[: -self.keep]:
            if path != newest:
                shutil.rmtree(path, ignore_errors=True)

    def sweep_partials(self) -> None:
        """Remove partial folders whose writer is not this process (it died or is gone)."""
        with contextlib.suppress(OSError):
            for path in self.directory.glob(f"{PARTIAL_PREFIX}*"):
                if not path.name.endswith(f"-{os.getpid()}"):
                    shutil.rmtree(path, ignore_errors=True)
