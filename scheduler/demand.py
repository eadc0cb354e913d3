"""The demand predictor's inputs (issue 17, item 3): the series of busy GPUs, arrivals, cell ends
and active sessions, and the features a model reads from them, computed the same way from a
whole trace (training, `series`) and online from events as they happen (the simulator and the
gateway, `DemandHistory`).

Every ``step_s`` seconds the series hold the GPUs held by running cells at the step's start
(busy), the GPUs of the cells submitted in the step (arrivals), the GPUs released by cells that
ended in the step (ends: sessions that just went idle, the likeliest to submit again soon) and
the sessions alive at the step's start (active). At step ``t`` the features (`FEATURES`) are the
time of day (as sine and cosine of the clock's seconds modulo a day), the change of busy over
the last step and its distance from its mean over the last ``window`` steps, the arrival and end
GPUs over those steps and the change in active sessions. They are level-free, so a busier month
than the training part is no extrapolation. A trace's clock is its minutes from its origin
(minute 0 taken as midnight); the gateway's is UTC.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.trace import Trace

#: the features' names, in the order `features` returns them; a model file records them
FEATURES = (
    "time_of_day_sin",
    "time_of_day_cos",
    "busy_change_last_step",
    "busy_above_window_mean",
    "arrival_gpus_in_window",
    "ended_gpus_in_window",
    "active_sessions_change_in_window",
)


@dataclass(frozen=True)
class Series:
    """Per step: busy GPUs (at the step's start), arrival GPUs and ended GPUs (in the step),
    active sessions (at the step's start); step ``t`` starts at ``start_s + t * step_s``."""

    step_s: float
    start_s: float
    busy: tuple[float, ...]
    arrivals: tuple[float, ...]
    ends: tuple[float, ...]
    active: tuple[float, ...]


def series(trace: Trace, step_s: float = 60.0) -> Series:
    """The trace's series at `step_s` resolution, from its first submit to its last end, as
    submitted (no scheduling delay); a session is active from its first submit to its last end."""
    if not step_s > 0:
        raise InvalidRequest(f"step_s must be > 0, not {step_s}")
    events = [e for s in trace.sessions for e in s.events]
    if not events:
        raise InvalidRequest(f"{trace.path}: no event to build a series from")
    start = min(e.submit_min for e in events) * 60
    end = max(e.end_min for e in events) * 60
    steps = int((end - start) // step_s) + 1
    busy = [0.0] * (steps + 1)  # difference arrays, summed below
    arrivals = [0.0] * steps
    ends = [0.0] * steps
    active = [0.0] * (steps + 1)

    def index(seconds: float) -> int:
        return min(steps, math.ceil((seconds - start) / step_s))

    def within(seconds: float) -> int:
        return min(steps - 1, int((seconds - start) // step_s))

    for event in events:
        busy[index(event.submit_min * 60)] += event.gpus
        busy[index(event.end_min * 60)] -= event.gpus
        arrivals[within(event.submit_min * 60)] += event.gpus
        ends[within(event.end_min * 60)] += event.gpus
    for session in trace.sessions:
        active[index(session.start_min * 60)] += 1
        active[index(session.end_min * 60)] -= 1
    return Series(
        step_s,
        start,
        _running(busy[:steps]),
        tuple(arrivals),
        tuple(ends),
        _running(active[:steps]),
    )


def _running(deltas: list[float]) -> tuple[float, ...]:
    total, out = 0.0, []
    for delta in deltas:
        total += delta
        out.append(total)
    return tuple(out)


def features(data: Series, t: int, window: int) -> list[float]:
    """The features (`FEATURES`) at the start of step `t` (needs ``t >= window``): busy and active
    at the starts of steps ``t - window .. t``, arrivals and ends of the complete steps before
    ``t``; nothing from after the step's start."""
    return _features(
        data.start_s + t * data.step_s,
        data.busy[t - window : t + 1],
        data.arrivals[t - window : t],
        data.ends[t - window : t],
        data.active[t] - data.active[t - window],
    )


def _features(
    clock_s: float,
    busy: Sequence[float],
    arrivals: Sequence[float],
    ends: Sequence[float],
    active_change: float,
) -> list[float]:
    """`busy`: the last ``window + 1`` step starts' values, oldest first; `arrivals` and `ends`:
    the last ``window`` complete steps'."""
    angle = 2 * math.pi * (clock_s % 86400) / 86400
    window = len(arrivals)
    now = busy[-1]
    return [
        math.sin(angle),
        math.cos(angle),
        now - busy[-2],
        now - sum(busy[1:]) / window,
        sum(arrivals),
        sum(ends),
        active_change,
    ]


@dataclass
class _Step:
    index: int
    busy: float | None = None  # at the step's start: its first observation
    active: float = 0.0
    arrivals: float = 0.0
    ends: float = 0.0


class DemandHistory:
    """The series of `series`, built online from what a caller sees, for the latest steps.

    Steps are ``[k * step_s, (k + 1) * step_s)`` on the caller's clock (non-decreasing). The
    caller reports each cell's submit (`arrival`) and end (`end`) with its GPUs, and calls
    `observe` with the busy GPUs and active sessions now, at least once a step: the first
    observation in a step stands for the step's start. A step with no observation (a gap
    longer than a step) takes the latest values observed before it, with no arrival or end.
    `features` are those of the latest step once it and the ``window`` steps before it are
    known.
    """

    def __init__(self, step_s: float, window: int) -> None:
        if not step_s > 0 or window < 1:
            raise InvalidRequest(
                f"a demand history needs step_s > 0 and window >= 1, not {step_s} and {window}"
            )
        self.step_s = step_s
        self.window = window
        self._steps: deque[_Step] = deque(maxlen=window + 1)
        self._latest: tuple[float, float] | None = None  # (busy, active) last observed

    def _current(self, now: float) -> _Step:
        index = math.floor(now / self.step_s)
        if self._steps and index <= self._steps[-1].index:
            return self._steps[-1]
        if self._steps:  # steps with no event: as last observed (unknown before any)
            busy, active = self._latest if self._latest is not None else (None, 0.0)
            first = max(self._steps[-1].index + 1, index - self.window)
            for missed in range(first, index):
                self._steps.append(_Step(missed, busy, active))
        self._steps.append(_Step(index))
        return self._steps[-1]

    def arrival(self, now: float, gpus: float) -> None:
        """A cell needing `gpus` GPUs was submitted at `now`."""
        self._current(now).arrivals += gpus

    def end(self, now: float, gpus: float) -> None:
        """A cell holding `gpus` GPUs ended at `now`."""
        self._current(now).ends += gpus

    def observe(self, now: float, busy: float, active: float) -> None:
        """The busy GPUs and active sessions at `now`."""
        step = self._current(now)
        if step.busy is None:
            step.busy, step.active = busy, active
        self._latest = (busy, active)

    @property
    def step(self) -> int | None:
        """The index of the latest step (it starts at ``step * step_s``); None before any."""
        return self._steps[-1].index if self._steps else None

    @property
    def busy_at_start(self) -> float | None:
        """The busy GPUs at the latest step's start; None before it is observed."""
        return self._steps[-1].busy if self._steps else None

    def features(self) -> list[float] | None:
        """The features at the latest step's start, or None while it or one of the ``window``
        steps before it is unknown."""
        steps = self._steps
        if len(steps) < self.window + 1 or any(step.busy is None for step in steps):
            return None
        complete = list(steps)[:-1]
        return _features(
            steps[-1].index * self.step_s,
            [step.busy for step in steps if step.busy is not None],
            [step.arrivals for step in complete],
            [step.ends for step in complete],
            steps[-1].active - steps[0].active,
        )
