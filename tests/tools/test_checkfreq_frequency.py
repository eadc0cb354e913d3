"""CheckFreq's frequency rule, the tuner and the profiler, on injected timings (a fake clock)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from kernelfleet.tools.checkfreq.frequency import (
    Tuner,
    bounded_interval,
    checkpoint_interval,
)
from kernelfleet.tools.checkfreq.guard import SnapshotGuard
from kernelfleet.tools.checkfreq.profiler import Profiler


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("iter_s", "snapshot_s", "persist_s", "k"),
    [
        (0.1, 0.02, 0.52, 5),  # (0.52 - 0.02) / 0.1 = 5 exactly
        (0.1, 0.02, 0.53, 6),  # just over: the next whole step
        (0.1, 0.05, 0.05, 1),  # the persist ends within one step
        (0.1, 0.3, 0.2, 1),  # a snapshot longer than the persist: at least 1
        (0.001, 0.0, 2.0, 2000),
    ],
)
def test_the_rule_waits_out_the_persist(iter_s, snapshot_s, persist_s, k):
    assert checkpoint_interval(iter_s, snapshot_s, persist_s) == k


def test_the_rule_refuses_a_zero_iteration_time():
    with pytest.raises(ValueError, match="above 0"):
        checkpoint_interval(0.0, 0.1, 1.0)


@pytest.mark.parametrize(
    ("iter_s", "stall_s", "bound", "k"),
    [(0.1, 0.05, 0.05, 10), (0.1, 0.051, 0.05, 11), (0.1, 0.001, 0.05, 1), (1.0, 0.35, 0.035, 10)],
)
def test_the_bound_sets_the_fewest_steps_that_keep_the_overhead_under_it(iter_s, stall_s, bound, k):
    assert bounded_interval(iter_s, stall_s, bound) == k
    assert stall_s / (k * iter_s) <= bound + 1e-12
    if k > 1:
        assert stall_s / ((k - 1) * iter_s) > bound


def test_the_tuner_takes_the_larger_of_the_rule_and_the_bound():
    tuner = Tuner(max_overhead=0.05)
    assert tuner.decide(iter_s=0.1, snapshot_s=0.01, persist_s=0.31, stall_s=0.01).interval == 3
    decision = Tuner(0.05).decide(iter_s=0.1, snapshot_s=0.01, persist_s=0.31, stall_s=0.04)
    assert (decision.interval, decision.rule_interval) == (8, 3)
    assert decision.predicted_overhead == pytest.approx(0.05)


def test_the_tuner_keeps_the_interval_within_the_bound_and_grows_it_beyond():
    tuner = Tuner(max_overhead=0.05)
    tuner.decide(0.1, 0.01, 0.21, 0.02)  # rule 2, bound 4
    assert tuner.interval == 4
    same = tuner.observe(0.049, 0.1, 0.01, 0.21, 0.02)
    assert (same.interval, same.retuned) == (4, False)
    # the stall grew (a slower disk, a busier machine): 0.06 per checkpoint at 0.1 s a step
    grown = tuner.observe(0.15, 0.1, 0.01, 0.21, 0.06)
    assert (grown.interval, grown.retuned, tuner.retunes) == (12, True, 1)
    # measured over the bound while the latest times say 12 is enough: still at least one more
    again = tuner.observe(0.06, 0.1, 0.01, 0.21, 0.06)
    assert again.interval == 13
    # persists got slower than the interval: never a checkpoint before the last one ended
    slower = tuner.observe(0.01, 0.1, 0.01, 2.01, 0.06)
    assert (slower.interval, slower.retuned) == (20, True)
    # the overhead falls: the interval is not shrunk
    assert tuner.observe(0.001, 0.1, 0.01, 0.21, 0.001).interval == 20


def test_the_profiler_separates_compute_from_stalls():
    clock = FakeClock()
    profiler = Profiler(clock=clock, window=3)
    assert profiler.iter_s is None
    profiler.iteration()
    for _ in range(4):
        clock.advance(0.1)
        profiler.iteration(quiet=True)
    assert profiler.iter_s == pytest.approx(0.1)
    mark = profiler.mark()
    clock.advance(0.1)
    profiler.stalled(0.05)  # the step took 0.15 s, of which 0.05 s waiting for a snapshot
    clock.advance(0.05)
    profiler.iteration()
    assert profiler.iter_s == pytest.approx(0.1)
    assert profiler.overhead_since(mark) == pytest.approx(0.05 / 0.15)
    assert profiler.overhead == pytest.approx(0.05 / 0.55)
    for _ in range(3):  # the window forgets older steps
        clock.advance(0.2)
        profiler.iteration()
    assert profiler.iter_s == pytest.approx(0.2)
    profiler.pause()  # a cell ended; the next one trains an hour later
    clock.advance(3600)
    profiler.iteration()
    assert profiler.iter_s == pytest.approx(0.2)
    assert profiler.overhead_since(mark) == pytest.approx(0.05 / 0.75)


def test_the_slowdown_counts_what_background_threads_take_from_the_loop():
    clock = FakeClock()
    profiler = Profiler(clock=clock)
    assert profiler.slowdown_since(profiler.mark()) == (0.0, 0.0)
    profiler.iteration()
    for _ in range(3):
        clock.advance(0.1)
        profiler.iteration(quiet=True)
    mark = profiler.mark()
    clock.advance(0.02)  # capturing the state
    profiler.stalled(0.02)
    clock.advance(0.1)
    profiler.iteration()
    for _ in range(3):  # a persist thread in flight slows each step to 0.12 s
        clock.advance(0.12)
        profiler.iteration()
    assert profiler.quiet_iter_s == pytest.approx(0.1)
    assert profiler.iter_s == pytest.approx((0.3 + 0.1 + 0.36) / 7)
    fraction, extra = profiler.slowdown_since(mark)
    assert extra == pytest.approx(0.02 + 3 * 0.02)  # the stall and the slower steps
    assert fraction == pytest.approx(0.08 / 0.48)
    assert profiler.overhead_since(mark) == pytest.approx(0.02 / 0.48)  # the stall alone


def test_the_guard_holds_a_step_until_the_snapshot_is_copied():
    guard = SnapshotGuard(time.perf_counter)
    assert guard.pass_through() == 0.0
    snapshot: Future[None] = Future()
    guard.hold(snapshot)
    with pytest.raises(RuntimeError):
        guard.hold(Future())
    threading.Timer(0.2, snapshot.set_result, args=(None,)).start()
    assert guard.holding
    waited = guard.pass_through()
    assert snapshot.done()
    assert waited >= 0.15
    assert guard.pass_through() == 0.0
    failed: Future[None] = Future()
    failed.set_exception(OSError("no space left"))
    guard.hold(failed)
    assert guard.pass_through() == 0.0  # a failed snapshot does not stop training
