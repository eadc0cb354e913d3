"""A seeded CPU training loop under CheckFreq, run as a subprocess by test_checkfreq_kill.py.

    python -m tests.tools.checkfreq_train DIR STEPS LOG [--resume] [--kill-at N]

Appends one line per step to LOG (``-``: stdout): ``step loss batch-sample-ids``. With
``--resume`` it first loads the newest checkpoint from DIR into freshly made objects (a new
process: what a notebook's setup cells made) and prints ``resumed at N``. With ``--kill-at N`` it
SIGKILLs itself right after step N's line (a host that vanished); if no checkpoint is complete
by then (a loaded machine), once the first one is. The loop has no checkpointing code: CheckFreq
hooks ``optimizer.step``.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings

from kernelfleet.tools.checkfreq import CheckFreq, CheckpointError
from tests.tools.checkfreq_setup import steps_of, training_objects


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    directory, steps, log_path = argv[0], int(argv[1]), argv[2]
    kill_at = int(argv[argv.index("--kill-at") + 1]) if "--kill-at" in argv else None
    objects = training_objects()
    cf = CheckFreq(directory, namespace=objects, profile_steps=3)
    start = 0
    if "--resume" in argv:
        try:
            start = cf.resume().step
        except CheckpointError as e:  # killed before its first checkpoint: from the start
            print(e, file=sys.stderr)
        print(f"resumed at {start}", flush=True)
    cf.attach()
    log = sys.stdout if log_path == "-" else open(log_path, "a")  # noqa: SIM115
    for step, loss, ids in steps_of(objects, steps, start):
        log.write(f"{step} {loss:.10f} {' '.join(map(str, ids))}\n")
        log.flush()
        if kill_at is not None and step >= kill_at:
            if cf.last_step is None:  # a loaded machine: let the first checkpoint end
                cf.wait()
            os.kill(os.getpid(), signal.SIGKILL)
    cf.detach()
    status = cf.status()
    print(f"checkpointed {status.last_step} error {status.last_error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
