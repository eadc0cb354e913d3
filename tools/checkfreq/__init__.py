"""CheckFreq: iteration-level checkpoints of a training loop with bounded overhead (``%checkfreq``).

::

    from kernelfleet.tools.checkfreq import CheckFreq

    cf = CheckFreq("ckpt", max_overhead=0.05, namespace=globals())
    cf.attach()          # the loop is unchanged: optimizer.step is hooked
    for batch in loader:
        ...
    cf.detach()

    # in a new process, after the same setup cells:
    cf = CheckFreq("ckpt", namespace=globals())
    cf.resume()          # model, optimizer, schedulers, loader position, RNG states, step
    cf.attach()

Modules: `profiler` (online timings), `frequency` (the rule and the tuner), `guard` (the snapshot
guard), `store` (the atomic folder layout), `state` (what is captured and restored), `checkfreq`
(`CheckFreq`, the hooks), `magics` (``%checkfreq``). docs/checkfreq.md has the user's guide.
"""

from __future__ import annotations

from kernelfleet.tools.checkfreq.checkfreq import CheckFreq, CheckFreqStatus, ResumeReport
from kernelfleet.tools.checkfreq.errors import CheckpointError

__all__ = ["CheckFreq", "CheckFreqStatus", "CheckpointError", "ResumeReport"]
