"""The gateway's durable state: its kernels, so a restarted gateway finds them again.

Hosts need no storing: their agents re-register with their next heartbeat. Kernels are written
as JSON after every change, atomically (a temporary file renamed over the old one), so a crash
never leaves a torn file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("kernelfleet.gateway.store")

FORMAT_VERSION = 1


class KernelStore:
    """Reads and writes ``<state_dir>/kernels.json``."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "kernels.json"

    def save(self, kernels: list[dict[str, Any]]) -> None:
        data = json.dumps({"version": FORMAT_VERSION, "kernels": kernels}, indent=1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".kernels-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def load(self) -> list[dict[str, Any]]:
        """The stored kernels; an unreadable file is set aside (``.corrupt``) and reads as none."""
        try:
            stored = json.loads(self.path.read_text())
            if stored.get("version") != FORMAT_VERSION or not isinstance(stored["kernels"], list):
                raise ValueError(f"not a version {FORMAT_VERSION} kernel file")
            return list(stored["kernels"])
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            aside = self.path.with_suffix(".corrupt")
            self.path.replace(aside)
            log.error(
                "%s is unreadable (%s); moved to %s, starting with no kernels", self.path, e, aside
            )
            return []
