"""A kernel's cells, run one at a time in arrival order, each on the replica chosen for it.

Jupyter clients may send several ``execute_request`` messages at once (Run All). A kernel runs
them one after the other; here the gateway keeps that queue itself, because the replica and the
GPUs of a cell are chosen only when the cell is next: the previous cell's executor has then
released its GPUs, and a cell that must wait for GPUs waits here, visibly, where an interrupt
can cancel it.

`CellQueue` knows nothing of GPUs or policies. Its owner supplies `Assign`, an async callable
that returns the `Assignment` of a cell (which replica, which devices, how to release them) and
may take its time; it reports why it waits through the `Cell.say` callback. A `CellWatcher`
hears of each cell's arrival, start and end (the fleet events and the kernel's recent cells).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelfleet.errors import FleetError, InvalidRequest
from kernelfleet.gateway.framing import ClientMessage
from kernelfleet.protocol import METADATA_KEY, CellKey, ErrorName, gpus_magic, options_of
from kernelfleet.stage_log import StageLog
from kernelfleet.states import Transitions, check_transition

log = logging.getLogger("kernelfleet.gateway.cells")

IDLE_GRACE = 1.0
"""Seconds a cell whose replica went idle waits for its ``execute_reply`` before it ends as
IDLE. A replica sends the reply before the idle status, but on another socket: the idle may
arrive first, and an ``error`` reply must still stop the client's later cells."""


stage_stamp = StageLog("gateway").stamp
"""Stamp a stage of a cell's path in the stage log (`kernelfleet.stage_log`), if it is on."""


class CellOutcome(enum.Enum):
    """How a cell's run on its replica ended (`Cell.ended`); PENDING until it does.

    The values are the ``execute_reply`` statuses where there is one."""

    PENDING = "pending"
    OK = "ok"
    ERROR = "error"
    ABORTED = "aborted"
    IDLE = "idle"
    """Its replica went idle after beginning it (its reply may follow)."""
    LOST = "lost"
    """Its replica was lost while it ran."""
    RETRY = "retry"
    """Its replica could not run it (lost before it began, or cut off from its group): it is
    sent again elsewhere, and becomes PENDING again (`Cell.reopen`)."""

    @classmethod
    def of_reply(cls, status: str) -> CellOutcome:
        """The outcome an ``execute_reply`` status stands for; a status Jupyter
        does not define ends the cell as OK does (nothing but ``error`` stops later cells)."""
        try:
            outcome = cls(status)
        except ValueError:
            return cls.OK
        return cls.OK if outcome is cls.PENDING else outcome


_ENDS = frozenset(CellOutcome) - {CellOutcome.PENDING}
CELL_TRANSITIONS: Transitions[CellOutcome] = {
    CellOutcome.PENDING: _ENDS,
    CellOutcome.RETRY: frozenset({CellOutcome.PENDING}),
    **{outcome: frozenset() for outcome in _ENDS - {CellOutcome.RETRY}},
}


@dataclass(frozen=True)
class Assignment:
    """Where a cell runs: `replica_id`, bound to `devices` (GPU ids on its host) while it runs.

    `release` gives the devices back; the queue calls it exactly once, when the cell ends.
    """

    replica_id: str
    devices: tuple[str, ...] = ()
    release: Callable[[], None] = field(default=lambda: None, compare=False)


class CellClient(Protocol):
    """The client a cell came from (a `ClientLink`): what the queue and the executor
    chooser tell it, and how the cell is sent."""

    def show_cell_status(self, cell: Cell, text: str) -> None:
        """Show `text` in the output of a cell that waits in the gateway."""

    def end_unsent_cell(self, cell: Cell, ename: str, why: str) -> None:
        """Answer a cell that never ran: an error reply (aborted for ``ename == "aborted"``)."""

    async def send_cell(self, cell: Cell, assignment: Assignment, yielders: list[str]) -> None:
        """Send `cell` to its assigned replica, and as a yield to `yielders`."""


@dataclass
class Cell:
    """One ``execute_request`` from one client, from arrival to its end."""

    message: ClientMessage
    client: CellClient
    """The client it came from (and whose sockets it is sent through)."""
    gpus: int | None
    """The cell's own GPU need (`cell_gpus`: its metadata, else its ``%%gpus N`` line), or None."""
    stop_on_error: bool
    received_at: float
    started: asyncio.Future[Assignment] = field(default_factory=asyncio.Future)
    ended: asyncio.Future[CellOutcome] = field(default_factory=asyncio.Future)
    """Resolves to its `outcome` once it is no longer PENDING (see `end`)."""
    outcome: CellOutcome = CellOutcome.PENDING
    attempt: int = 0
    """Raised each time the cell is sent again because its replica was lost before it began."""
    running: bool = False
    """Whether its replica began it (announced the code with ``execute_input``)."""
    excluded: set[str] = field(default_factory=set)
    """Replicas that were sent the cell and could not run it (lost, or cut off)."""
    gpus_used: int = 0
    """The GPUs it was given (its own need, else its kernel's), once assigned."""
    host_id: str | None = None
    """Its executor's host, once assigned."""
    started_at: float | None = None
    """When its replica began it (monotonic), if it did."""
    waited: str | None = None
    """Why it waited for GPUs, for a person ("waited 3.1 s for 1 GPU (2 cells ahead)")."""
    moved_to: str | None = None
    """The host a replica of its kernel moved to, to run it."""
    ahead: int | None = None
    """Cells ahead of it when it first waited for GPUs."""
    waiting_for: dict[str, Any] | None = None
    """Why it waits for GPUs now (the latest ``cell-waiting`` event's data), until it starts."""

    @property
    def id(self) -> str:
        return self.message.msg_id

    def say(self, text: str) -> None:
        """Show `text` in the cell's output (why it waits); replaces what was said before."""
        self.client.show_cell_status(self, text)

    def end(self, outcome: CellOutcome) -> None:
        """End this run with `outcome` and resolve `ended`. Callers check `ended` first: a
        cell ends once per run (`IllegalTransition` otherwise, naming the cell)."""
        self._move_to(outcome)
        self.ended.set_result(outcome)

    def reopen(self) -> None:
        """A RETRY cell is sent again: PENDING, with a fresh `ended`."""
        self._move_to(CellOutcome.PENDING)
        self.ended = asyncio.get_running_loop().create_future()

    def _move_to(self, outcome: CellOutcome) -> None:
        self.outcome = check_transition(CELL_TRANSITIONS, f"cell {self.id}", self.outcome, outcome)


class CellWatcher(Protocol):
    """Who hears of a kernel's cells (the `KernelLinker`). Called on the event loop, on the
    cell's path: each call must be cheap and must not wait."""

    def cell_queued(self, cell: Cell, queued: int) -> None:
        """`cell` arrived; `queued` of the kernel's cells (it included) have not started."""

    def cell_started(self, cell: Cell, assignment: Assignment) -> None:
        """The replica of `assignment` began `cell` (``execute_input``)."""

    def cell_finished(self, cell: Cell) -> None:
        """`cell` ended with `Cell.outcome`, having run or not (never for a RETRY)."""


class _Unwatched:
    def cell_queued(self, cell: Cell, queued: int) -> None:
        pass

    def cell_started(self, cell: Cell, assignment: Assignment) -> None:
        pass

    def cell_finished(self, cell: Cell) -> None:
        pass


Assign = Callable[[Cell], Awaitable[Assignment]]
Dispatch = Callable[[Cell, Assignment], Awaitable[None]]


class UsageError(InvalidRequest):
    """A cell's leading ``%%gpus N`` line is malformed. The cell fails at once under this
    class's name, `ErrorName.USAGE_ERROR`, as IPython fails a magic used wrongly."""

    reason = "usage-error"


def cell_gpus(message: ClientMessage) -> int | None:
    """The GPU count a cell asks for, or None (then its kernel's count applies).

    Its metadata (`CellKey.GPUS`) comes first, then a leading ``%%gpus N`` line of its code
    (`gpus_magic`). `InvalidRequest` for metadata that is not JSON or a count that is not a
    non-negative integer; `UsageError` for a malformed ``%%gpus`` line. Whether a host has
    that many GPUs is the policy's question, when the cell is next (`NoCapacity` if none)."""
    try:
        metadata = json.loads(message.parts[2])
    except ValueError:
        raise InvalidRequest("the execute_request metadata is not JSON") from None
    gpus = options_of(metadata).get(CellKey.GPUS)
    if gpus is None:
        return _magic_gpus(message)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidRequest(
            f"{METADATA_KEY}.{CellKey.GPUS} must be a non-negative integer, not {gpus!r}"
        )
    return gpus


def _magic_gpus(message: ClientMessage) -> int | None:
    try:
        content = json.loads(message.parts[3])
    except ValueError:
        return None  # not ours to judge: the kernel answers a malformed request
    code = content.get("code") if isinstance(content, dict) else None
    if not isinstance(code, str):
        return None
    try:
        return gpus_magic(code)
    except InvalidRequest as e:
        raise UsageError(e.message) from None


def stops_on_error(message: ClientMessage) -> bool:
    try:
        content = json.loads(message.parts[3])
    except ValueError:
        return True
    return bool(content.get("stop_on_error", True)) if isinstance(content, dict) else True


class CellQueue:
    """Runs one kernel's cells in arrival order: assign, dispatch, wait for the end, release."""

    def __init__(
        self,
        kernel_id: str,
        assign: Assign,
        dispatch: Dispatch,
        watcher: CellWatcher | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self._watcher = watcher or _Unwatched()
        self._assign = assign
        self._dispatch = dispatch
        self._waiting: deque[Cell] = deque()
        self._wakeup = asyncio.Event()
        self._paused = 0
        self.current: Cell | None = None
        self.current_assignment: Assignment | None = None
        self._assigning: asyncio.Task[Assignment] | None = None
        self._runner = asyncio.ensure_future(self._run())

    def submit(self, cell: Cell) -> None:
        self._waiting.append(cell)
        self._wakeup.set()
        self._watcher.cell_queued(cell, self.queued)

    @property
    def queued(self) -> int:
        """The kernel's cells not yet begun by a replica (waiting here, or being assigned)."""
        current = self.current
        return len(self._waiting) + (1 if current is not None and not current.running else 0)

    def cancel_waiting(self, why: str) -> None:
        """Cancel every cell not yet sent to a replica (an interrupt)."""
        if self.current is not None and self._assigning is not None:
            self._assigning.cancel()
        while self._waiting:
            self._end_unsent(self._waiting.popleft(), ErrorName.INTERRUPTED, why)

    def finish(self, cell_id: str, outcome: CellOutcome, replica_id: str | None = None) -> None:
        """The cell `cell_id` ended with `outcome` on `replica_id`, if given; ignored if it is
        not the running cell, ran elsewhere, or ended already."""
        cell, assignment = self.current, self.current_assignment
        if cell is None or cell.id != cell_id or assignment is None:
            return
        if replica_id is not None and replica_id != assignment.replica_id:
            return
        if replica_id is not None and outcome in (CellOutcome.OK, CellOutcome.ERROR):
            # its reply proves the replica began it; the shell reply may be read before the
            # IOPub execute_input that marks a cell running (each socket has its own pump)
            self.mark_running(cell_id, replica_id)
        if not cell.ended.done():
            cell.end(outcome)

    def finish_idle(self, cell_id: str, replica_id: str) -> None:
        """The replica of `cell_id` went idle: the cell ends if the replica had begun it (a
        replica that refused it goes idle too, and its reply says what comes next), with its
        reply's outcome if that arrives within `IDLE_GRACE`, else as IDLE."""
        if self.current is not None and self.current.id == cell_id and self.current.running:
            loop = asyncio.get_running_loop()
            loop.call_later(IDLE_GRACE, self.finish, cell_id, CellOutcome.IDLE, replica_id)

    def client_gone(self, client: CellClient) -> None:
        """A client closed: its waiting cells are dropped, and its current cell, if not begun,
        ends (nobody would hear its reply)."""
        for waiting in [c for c in self._waiting if c.client is client]:
            self._waiting.remove(waiting)
        current = self.current
        if current is not None and current.client is client and not current.running:
            if self._assigning is not None:
                self._assigning.cancel()
            elif not current.ended.done():
                current.end(CellOutcome.ABORTED)

    def mark_running(self, cell_id: str, replica_id: str) -> None:
        cell, assignment = self.current, self.current_assignment
        if cell is None or cell.id != cell_id or assignment is None or cell.running:
            return
        if assignment.replica_id == replica_id:
            stage_stamp(cell_id, "execute_input_in")
            cell.running = True
            self._watcher.cell_started(cell, assignment)

    def replica_lost(self, replica_id: str) -> str | None:
        """`replica_id` is gone. A cell it was running ends as lost; one it had not begun is
        sent again elsewhere, and its id is returned (its client must not hear of the loss)."""
        cell, assignment = self.current, self.current_assignment
        if cell is None or assignment is None or assignment.replica_id != replica_id:
            return None
        if cell.running:
            self.finish(cell.id, CellOutcome.LOST)
            return None
        self.finish(cell.id, CellOutcome.RETRY)
        return cell.id

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold new cells while the body runs, once the running one (if any) has ended."""
        self._paused += 1
        try:
            while self.current is not None and self.current.started.done():
                await asyncio.shield(self.current.ended)
            yield
        finally:
            self._paused -= 1
            self._wakeup.set()

    def close(self, why: str) -> None:
        """Stop: cells not yet sent get an error reply saying `why`."""
        self._runner.cancel()
        if self._assigning is not None:
            self._assigning.cancel()
        for cell in [*self._waiting, *([self.current] if self.current else [])]:
            if not cell.started.done():
                self._end_unsent(cell, ErrorName.KERNEL_UNAVAILABLE, why)
            elif not cell.ended.done():  # sent: its clients are told `why` by the link
                cell.end(CellOutcome.LOST)
                self._watcher.cell_finished(cell)
        self._waiting.clear()

    async def _run(self) -> None:
        while True:
            while not self._waiting or self._paused:
                self._wakeup.clear()
                await self._wakeup.wait()
            cell = self._waiting.popleft()
            stage_stamp(cell.id, "dequeued")
            self.current = cell
            try:
                await self._run_cell(cell)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("kernel %s: cell %s failed in the gateway", self.kernel_id, cell.id)
                if not cell.started.done():
                    why = f"the gateway could not run it: {e}"
                    self._end_unsent(cell, ErrorName.GATEWAY_ERROR, why)
            finally:
                self.current = None
                self.current_assignment = None

    async def _run_cell(self, cell: Cell) -> None:
        while True:
            self._assigning = asyncio.ensure_future(self._assign(cell))
            try:
                assignment = await self._assigning
            except asyncio.CancelledError:
                if self._runner.cancelled():
                    raise
                self._end_unsent(cell, ErrorName.INTERRUPTED, "interrupted while waiting to run")
                return
            except FleetError as e:
                self._end_unsent(cell, type(e).__name__, e.message)
                return
            finally:
                self._assigning = None
            stage_stamp(cell.id, "assigned")
            self.current_assignment = assignment
            try:
                if not cell.started.done():
                    cell.started.set_result(assignment)
                await self._dispatch(cell, assignment)
                status = await cell.ended
            finally:
                assignment.release()
            if status is not CellOutcome.RETRY:
                self._watcher.cell_finished(cell)
                break
            log.warning(
                "kernel %s: cell %s could not run on %s; sent again",
                self.kernel_id, cell.id, assignment.replica_id,
            )  # fmt: skip
            cell.excluded.add(assignment.replica_id)
            cell.attempt += 1
            cell.reopen()
            self.current_assignment = None
        if status is CellOutcome.ERROR and cell.stop_on_error:
            for later in [c for c in self._waiting if c.client is cell.client and c.stop_on_error]:
                self._waiting.remove(later)
                self._end_unsent(later, "aborted", "")

    def _end_unsent(self, cell: Cell, ename: str, why: str) -> None:
        """Answer a cell that never reached a replica: an error (or aborted) reply, then idle."""
        if not cell.ended.done():
            cell.end(CellOutcome.ABORTED if ename == "aborted" else CellOutcome.ERROR)
            self._watcher.cell_finished(cell)
        cell.client.end_unsent_cell(cell, ename, why)
