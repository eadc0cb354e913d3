"""A background job's script that checkpoints with CheckFreq, run as a subprocess by
test_checkfreq_job.py in the environment the host agent gives a job (``KERNELFLEET_JOB_*``).

It trains the seeded loop of checkfreq_setup, printing ``step loss ids`` per step. Asked to stop
(SIGTERM: `Job.should_stop`), it checkpoints at once at the end of the step, tells the gateway
the checkpoint's step (``Job.save_checkpoint``) and exits 0. Started again, it resumes from that
checkpoint and prints ``resumed at N`` first.
"""

from __future__ import annotations

import contextlib
import sys
import warnings

from kernelfleet.jobs.sdk import current_job
from kernelfleet.tools.checkfreq import CheckFreq, CheckpointError
from tests.tools.checkfreq_setup import steps_of, training_objects


def main() -> int:
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    job = current_job()
    assert job.checkpoint_dir is not None
    objects = training_objects()
    cf = CheckFreq(job.checkpoint_dir / "checkfreq", namespace=objects, profile_steps=3)
    start = 0
    with contextlib.suppress(CheckpointError):  # none yet: the job's first run
        start = cf.resume().step
    print(f"resumed at {start}", flush=True)
    cf.attach()
    for step, loss, ids in steps_of(objects, job.steps, start):
        print(f"{step} {loss:.10f} {' '.join(map(str, ids))}", flush=True)
        job.report(step)
        if job.should_stop:
            saved = cf.checkpoint_now()
            job.save_checkpoint({"checkfreq_step": saved}, step=saved)  # the gateway's record
            print(f"stopped at {saved}", flush=True)
            job.exit(0)
    cf.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
