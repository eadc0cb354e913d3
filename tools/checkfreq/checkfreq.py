"""`CheckFreq`: iteration-level checkpoints of a training loop, at a frequency that bounds the
overhead (CheckFreq, FAST'21), over torch.distributed.checkpoint.

Lifecycle (one training loop, in the thread that runs it)::

    cf = CheckFreq(directory, max_overhead=0.05, namespace=globals())
    cf.resume()        # optional: the newest complete checkpoint back into the objects
    cf.attach()        # every optimizer.step of the namespace's optimizer is now a step boundary
    ...train...        # unchanged loop
    cf.detach()        # waits for the checkpoint in flight

At each step boundary (after the optimizer's step, or a call of `CheckFreq.step` in loops without
one) the profiler records the iteration's time. The first `profile_steps` steps only measure;
then one checkpoint measures the snapshot and persist costs, and the `Tuner` chooses the interval
`k`. Every `k` steps a checkpoint is taken in two phases:

1. snapshot: the state is captured (`state.capture`) and `torch.distributed.checkpoint.async_save`
   stages (copies) it in a background thread while the next iteration computes; the
   `SnapshotGuard` holds the next ``optimizer.step`` until the copy is done;
2. persist: async_save's upload thread writes it into a partial folder, then `CheckpointStore`
   commits it (manifest, fsync, rename, ``latest``).

At most one checkpoint is in flight: a checkpoint due while the previous one still persists is
taken at the first boundary after it ended. Before each checkpoint the overhead measured over the
last cycle goes to the tuner, which grows `k` when it exceeds the bound.

Failures never stop training: a checkpoint that cannot be written (folder full or gone) is
discarded whole, the user is told once on stderr (again only after a checkpoint succeeded), and
the next one is tried `k` steps later. An object that cannot be snapshotted raises
`CheckpointError` from `attach` (which captures once to check), or, if it appears later, turns
checkpointing off with one message.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from kernelfleet.tools.checkfreq import state
from kernelfleet.tools.checkfreq.errors import CheckpointError
from kernelfleet.tools.checkfreq.frequency import Tuner
from kernelfleet.tools.checkfreq.guard import SnapshotGuard
from kernelfleet.tools.checkfreq.profiler import Profiler
from kernelfleet.tools.checkfreq.store import CheckpointStore

PROFILE_STEPS = 5
"""Steps measured before the first checkpoint."""


@dataclass(frozen=True)
class CheckFreqStatus:
    """What `CheckFreq.status` reports. Times are seconds (None until measured); `frequency` is
    the interval in steps (None while profiling); `overhead` the fraction of training time since
    `attach` the loop stalled for checkpoints (what the bound is on); `slowdown` the fraction by
    which training was slower than its quiet steps (`Profiler.slowdown_since`: the stalls and
    the background threads' competition for the cores, and any change of the machine's load);
    `last_step` the step of the newest complete checkpoint (None: none yet)."""

    enabled: bool
    directory: str
    step: int
    frequency: int | None
    iter_s: float | None
    snapshot_s: float | None
    persist_s: float | None
    overhead: float
    slowdown: float
    max_overhead: float
    last_step: int | None
    in_flight: bool
    last_error: str | None


@dataclass(frozen=True, repr=False)
class ResumeReport:
    """What `CheckFreq.resume` restored: the step it continues from, the objects' names, and the
    checkpoint folder."""

    step: int
    restored: list[str]
    path: str

    def __repr__(self) -> str:
        return f"resumed at step {self.step} from {self.path}: {', '.join(self.restored)}"


@dataclass
class _InFlight:
    """One checkpoint between its capture and its commit (or failure)."""

    step: int
    started: float
    partial: Path
    captured: state.Captured
    stall: float = 0.0
    staged_at: float | None = None
    late: dict[str, Any] | None = None
    late_taken: threading.Event = field(default_factory=threading.Event)
    ended: bool = False
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class CheckFreq:
    """Checkpoints of the training objects in `namespace` (a dict: the notebook's globals, by
    default ``__main__``'s) into `directory`; see the module docstring."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_overhead: float = 0.05,
        namespace: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        profile_steps: int = PROFILE_STEPS,
        keep: int = 2,
    ) -> None:
        if not 0 < max_overhead < 1:
            raise CheckpointError(f"the overhead bound must be between 0 and 1, not {max_overhead}")
        if namespace is None:
            namespace = vars(sys.modules["__main__"])
        self.directory = Path(directory)
        self.namespace = namespace
        self.max_overhead = max_overhead
        self.profile_steps = profile_steps
        self.store = CheckpointStore(self.directory, keep=keep)
        self.profiler = Profiler(clock=clock)
        self.tuner = Tuner(max_overhead)
        self.guard = SnapshotGuard(clock)
        self.step_count = 0
        self.last_step: int | None = None
        self.last_error: str | None = None
        self._clock = clock
        self._hooks: list[Any] = []
        self._enabled = False
        self._busy = False  # capturing or restoring: optimizer steps made there are not ours
        self._primary: dict[int, bool] = {}
        self._in_flight: _InFlight | None = None
        self._first_done: _InFlight | None = None
        self._cycle_mark: tuple[float, float, int] | None = None
        self._attach_mark = self.profiler.mark()
        self._since_checkpoint = 0
        self._told = False

    # ---- public API ---------------------------------------------------------------------------

    def attach(self) -> None:
        """Check the folder and the objects (a trial capture), then hook every optimizer's step.
        Raises `CheckpointError` when the folder cannot be written or an object cannot be
        snapshotted. Attaching twice is a no-op."""
        if self._enabled:
            return
        self.store.prepare()
        captured = self._capture()
        state.extra_bytes(captured, state.capture_late(self.namespace, captured.kinds))
        self._attach_mark = self.profiler.mark()
        self._hooks = [
            register_optimizer_step_pre_hook(self._before_update),
            register_optimizer_step_post_hook(self._after_update),
        ]
        self._enabled = True

    def detach(self) -> None:
        """Unhook and wait for the checkpoint in flight."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._enabled = False
        self.wait()

    def step(self) -> None:
        """A step boundary, for loops without a torch optimizer: call after each iteration's
        updates (schedulers included). The snapshot is not overlapped here: it ends before this
        returns, since the loop's next update is not seen."""
        if self._enabled:
            self._boundary()
            self.settle()

    def settle(self) -> None:
        """The loop paused (a cell ended) or its next update comes: finish the snapshot in
        flight and take its late part (`state.capture_late`) now, so it can be committed."""
        self._stall(self.guard.pass_through())
        flight = self._in_flight
        if flight is not None and not flight.late_taken.is_set():
            started = self._clock()
            try:
                flight.late = state.capture_late(self.namespace, flight.captured.kinds)
            finally:
                flight.late_taken.set()
            self._stall(self._clock() - started)

    def pause(self) -> None:
        """The loop stopped for now (a cell ended): `settle`, and the time until the next step
        is not counted as training time (nor as overhead)."""
        self.settle()
        self.profiler.pause()

    def wait(self) -> None:
        """Until the checkpoint in flight (if any) is persisted or has failed."""
        flight = self._in_flight
        if flight is not None:
            self.settle()
            flight.done.wait()
        self._tell()

    def checkpoint_now(self) -> int | None:
        """Take a checkpoint of the current step at once (between iterations) and wait until it
        is persisted: a job asked to stop, the end of training. Returns the step of the newest
        complete checkpoint."""
        self.wait()
        if self.last_step != self.step_count:
            self._start_checkpoint()
            self.wait()
        return self.last_step

    def status(self) -> CheckFreqStatus:
        flight = self._in_flight
        return CheckFreqStatus(
            enabled=self._enabled,
            directory=str(self.directory),
            step=self.step_count,
            frequency=self.tuner.interval or None,
            iter_s=self.profiler.iter_s,
            snapshot_s=self.profiler.snapshot_s,
            persist_s=self.profiler.persist_s,
            overhead=self.profiler.overhead_since(self._attach_mark),
            slowdown=self.profiler.slowdown_since(self._attach_mark)[0],
            max_overhead=self.max_overhead,
            last_step=self.last_step,
            in_flight=flight is not None and not flight.ended,
            last_error=self.last_error,
        )

    def resume(self) -> ResumeReport:
        """Load the newest complete checkpoint into the namespace's objects of the same names,
        with the RNG states and the step counter. Raises `CheckpointError` when there is none,
        or when the namespace lacks an object it holds."""
        path = self.store.newest()
        if path is None:
            raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
        manifest = self.store.manifest(path)
        self.wait()
        self._busy = True
        try:
            step, names = state.restore(self.namespace, path, manifest)
        finally:
            self._busy = False
        self.step_count = self.last_step = step
        self._since_checkpoint = 0
        return ResumeReport(step, names, str(path))

    @staticmethod
    def saved_settings(directory: str | Path) -> dict[str, Any]:
        """The settings saved with the newest complete checkpoint in `directory` (what
        `CheckFreq` was made with), for a new process that resumes it. Raises `CheckpointError`
        when there is no checkpoint."""
        store = CheckpointStore(directory)
        path = store.newest()
        if path is None:
            raise CheckpointError(f"no checkpoint to resume from in {directory}")
        return dict(store.manifest(path).get("settings", {}))

    # ---- the hooks ----------------------------------------------------------------------------

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._busy:
            self.settle()

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._busy or not self._is_primary(optimizer):
            return
        self._boundary()

    def _is_primary(self, optimizer: Any) -> bool:
        """Whether `optimizer`'s step ends an iteration: it is the namespace's first optimizer
        by name (looked up once per optimizer object)."""
        known = self._primary.get(id(optimizer))
        if known is None:
            found = [
                o for k, o in state.find_objects(self.namespace).values() if k == state.OPTIMIZER
            ]
            known = bool(found) and found[0] is optimizer
            self._primary = (
                {id(optimizer): known} if known else {**self._primary, id(optimizer): False}
            )
        return known

    def _boundary(self) -> None:
        flight = self._in_flight
        self.profiler.iteration(quiet=flight is None or flight.ended)
        self.step_count += 1
        self._since_checkpoint += 1
        self._tell()
        flight = self._in_flight
        if flight is not None and not flight.ended:
            return  # at most one in flight: a due checkpoint waits for this one's end
        if self.tuner.interval == 0:
            self._profile_phase()
            return
        if self._since_checkpoint < self.tuner.interval:
            return
        if self._cycle_mark is not None:
            self._retune(self.profiler.overhead_since(self._cycle_mark))
            if self._since_checkpoint < self.tuner.interval:
                return
        self._start_checkpoint()

    def _profile_phase(self) -> None:
        first = self._first_done
        if first is None:
            if self.profiler.steps > self.profile_steps and self._in_flight is None:
                self._start_checkpoint()
            return
        if self.profiler.iter_s is None:
            return
        self.tuner.decide(
            self.profiler.iter_s,
            self.profiler.snapshot_s or 0.0,
            self.profiler.persist_s or 0.0,
            first.stall,
        )

    def _retune(self, measured: float) -> None:
        """After a cycle whose stalls took `measured` of its training time. The bound is on the
        stall (what the loop waited for), not on the whole slowdown (`Profiler.slowdown_since`),
        which also counts what the persist thread takes from the loop's cores: that figure
        follows every change of the machine's load too, and grew the interval to thousands of
        steps on a shared 2-core machine (docs/checkfreq.md)."""
        iter_s = self.profiler.iter_s
        if iter_s is None or self.profiler.stall_s is None:
            return
        self.tuner.observe(
            measured,
            iter_s,
            self.profiler.snapshot_s or 0.0,
            self.profiler.persist_s or 0.0,
            self.profiler.stall_s,
        )

    # ---- one checkpoint -----------------------------------------------------------------------

    def _stall(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.profiler.stalled(seconds)
        flight = self._in_flight
        if flight is not None:
            flight.stall += seconds
            self.profiler.checkpoint_stall(flight.stall)

    def _capture(self) -> state.Captured:
        self._busy = True
        try:
            return state.capture(self.namespace, self.step_count)
        finally:
            self._busy = False

    def _start_checkpoint(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        started = self._clock()
        self._cycle_mark = self.profiler.mark()
        self._since_checkpoint = 0
        try:
            captured = self._capture()
        except CheckpointError as e:
            self._fail_for_good(str(e))
            return
        try:
            partial = self.store.begin(self.step_count)
        except OSError as e:
            self._failed(f"cannot write checkpoints to {self.directory}: {e.strerror or e}")
            return
        # staging in a thread of its own (the snapshot), in plain memory (no pinned or shared
        # memory: CPU tensors, and no worker process)
        stager = DefaultStager(StagingOptions(False, False, True, False))
        state.quiet_single_process()
        try:
            response = dcp.async_save(
                captured.tensors,
                storage_writer=dcp.FileSystemWriter(partial, sync_files=True),
                async_stager=stager,
                no_dist=True,
            )
        except Exception as e:
            stager.close()
            self.store.discard(partial)
            self._failed(f"checkpoint of step {self.step_count} not written: {_why(e)}")
            return
        assert not isinstance(response, Future)  # with an async stager: two futures come back
        flight = _InFlight(self.step_count, started, partial, captured)
        self._in_flight = flight
        self.guard.hold(response.staging_completion)
        response.staging_completion.add_done_callback(lambda _: self._staged(flight))
        threading.Thread(
            target=self._persist,
            args=(flight, response.upload_completion, stager),
            name=f"checkfreq-persist-{flight.step}",
            daemon=True,
        ).start()
        self._stall(self._clock() - started)

    def _staged(self, flight: _InFlight) -> None:
        flight.staged_at = self._clock()
        self.profiler.snapshot(flight.staged_at - flight.started)

    def _persist(self, flight: _InFlight, upload: Future[Any], stager: Any) -> None:
        """The persist phase (its own thread): wait for async_save's upload and the late part,
        then commit the checkpoint, or discard it whole."""
        manifest = {
            "kinds": flight.captured.kinds,
            "owners": flight.captured.owners,
            "settings": {"max_overhead": self.max_overhead, "directory": str(self.directory)},
            "created": time.time(),
        }
        try:
            try:
                upload.result()
            finally:
                stager.close()
            flight.late_taken.wait()
            if flight.late is None:
                raise CheckpointError("the schedulers' state could not be taken")
            extra = state.extra_bytes(flight.captured, flight.late)
            self.store.commit(flight.partial, flight.step, manifest, {state.EXTRA: extra})
            self.store.prune()
        except BaseException as e:  # torch.distributed.checkpoint's CheckpointException is one
            self.store.discard(flight.partial)
            flight.error = _why(e)
            self.last_error = f"checkpoint of step {flight.step} not written: {flight.error}"
        else:
            self.last_step = flight.step
            self.last_error = None
            self._told = False
        staged_at = flight.staged_at if flight.staged_at is not None else flight.started
        self.profiler.persist(self._clock() - staged_at)
        if self.tuner.interval == 0:
            self._first_done = flight
        flight.ended = True
        flight.done.set()

    def _failed(self, message: str) -> None:
        self.last_error = message
        self._tell()

    def _fail_for_good(self, message: str) -> None:
        self.last_error = f"{message}; checkpointing is off"
        self._tell()
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._enabled = False

    def _tell(self) -> None:
        """Say the last error on stderr, once (again only after a checkpoint succeeded)."""
        if self.last_error is not None and not self._told:
            self._told = True
            print(f"checkfreq: {self.last_error}; training goes on", file=sys.stderr)


def _why(e: BaseException) -> str:
    """One line for a failed write: the OSError under torch.distributed.checkpoint's wrapping
    (a chain of causes, or its per-rank ``failures``) when there is one."""
    seen: list[BaseException] = [e]
    while seen:
        error = seen.pop()
        if isinstance(error, OSError):
            where = f": {error.filename}" if error.filename else ""
            return f"{error.strerror or error}{where}"
        failures = getattr(error, "failures", None)
        if isinstance(failures, dict):
            seen += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        seen += [c for c in (error.__cause__, error.__context__) if c is not None]
    return f"{type(e).__name__}: {e}".splitlines()[0]
