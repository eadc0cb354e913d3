"""The stage log: a line per stage of a cell's path, for mapping where a cell's time goes.

`ENV` (``KERNELFLEET_STAGE_LOG``) names a file to which the gateway (`gateway/cells.py`,
`gateway/channels.py`) and each executor replica (`kernels/replica/kernel.py`) append
``<time.monotonic()> <side> <cell id> <stage>``; it is off (unset) by default, and
benchmarks/cell_stages.py sets it. CLOCK_MONOTONIC is one clock per machine, so the stamps of
every process on it compare directly. Off, a stamp costs one ``None`` check.
"""

from __future__ import annotations

import os
import time
from typing import TextIO

ENV = "KERNELFLEET_STAGE_LOG"


class StageLog:
    """Stamps of one side (``gateway`` or ``replica``), to the file `ENV` named when the
    process started, if any. The file stays open, line-buffered: one write per stamp."""

    def __init__(self, side: str) -> None:
        self.side = side
        path = os.environ.get(ENV)
        self._file: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def stamp(self, cell_id: str, stage: str) -> None:
        """Append ``<time.monotonic()> <side> <cell_id> <stage>``, if the log is on."""
        if self._file is not None:
            self._file.write(f"{time.monotonic():.6f} {self.side} {cell_id} {stage}\n")
