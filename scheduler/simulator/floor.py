"""The GPU-hour floor and each policy's share of the possible saving (docs/economics.md).

No policy can provision fewer GPU-hours than its cells hold GPUs: the floor is the trace's busy
GPU-hours, ``sum(gpus * duration)`` over the cells that fit a host. `reservation` (GPUs held for
a session's life) is the baseline, so the saving there is to make is ``reservation - floor``,
and a policy's share of it is ``(reservation - policy) / (reservation - floor)``: 0 for
reservation, 1 for a fleet that provisions only what cells use.
"""

from __future__ import annotations

from kernelfleet.scheduler.trace import Trace

BASELINE = "reservation"


def busy_floor_gpu_hours(trace: Trace, gpus_per_host: int) -> float:
    """The GPU-hours the trace's cells hold, counting those that fit a host of
    `gpus_per_host` GPUs (the others are rejected by every policy)."""
    minutes = sum(
        event.gpus * event.duration_min
        for session in trace.sessions
        if session.gpus <= gpus_per_host
        for event in session.events
    )
    return minutes / 60


def saving_share(policy: float, reservation: float, floor: float) -> float | None:
    """``(reservation - policy) / (reservation - floor)``; None when reservation does not
    exceed the floor (there is no saving to share)."""
    possible = reservation - floor
    if possible <= 0:
        return None
    return (reservation - policy) / possible
