"""A replica's log records, its own and pysyncobj's, go to its log file (the process's stderr
as it was at start), never into the running cell's output: a pysyncobj warning once reached a
notebook as a stderr stream (caught by ipykernel's own message-spec suite through the bridge)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import io, logging, sys
from kernelfleet.kernels.replica.kernel import log_to_process_stderr
log_to_process_stderr()
captured = io.StringIO()
sys.stderr = captured  # as ipykernel replaces it while a cell runs
logging.getLogger("pysyncobj.syncobj").critical("raft says %s", "hello")
logging.getLogger("kernelfleet.replica").warning("replica says hello")
sys.stdout.write("CAPTURED=" + repr(captured.getvalue()))
"""


def test_log_records_reach_the_log_file_not_the_cell_output() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("CAPTURED=''"), done.stdout
    assert "CRITICAL pysyncobj.syncobj: raft says hello" in done.stderr
    assert "WARNING kernelfleet.replica: replica says hello" in done.stderr
