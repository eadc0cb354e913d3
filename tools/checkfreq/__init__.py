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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelfleet.tools.checkfreq.checkfreq import CheckFreq, CheckFreqStatus, ResumeReport
    from kernelfleet.tools.checkfreq.errors import CheckpointError

__all__ = ["CheckFreq", "CheckFreqStatus", "CheckpointError", "ResumeReport"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: a kernel loads ``%checkfreq`` at start (this
    package's `magics`) and must not import torch until the magic is used."""
    if name == "CheckpointError":
        from kernelfleet.tools.checkfreq import errors

        return errors.CheckpointError
    if name in __all__:
        from kernelfleet.tools.checkfreq import checkfreq

        return getattr(checkfreq, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
