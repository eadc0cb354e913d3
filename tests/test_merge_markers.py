"""No tracked text file keeps a merge's conflict markers (ruff catches them in Python only; a
README or a doc with one would ship as it is)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(rb"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_has_conflict_markers() -> None:
    marked = []
    for path in tracked_files():
        if not path.is_file() or path.suffix in {".png", ".lock"}:
            continue
        data = path.read_bytes()
        if b"\0" not in data[:1024] and MARKER.search(data):
            marked.append(str(path.relative_to(ROOT)))
    assert not marked, f"conflict markers left in {marked}"
