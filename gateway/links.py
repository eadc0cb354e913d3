"""Linking a kernel to its live replicas, and what the link tells the kernel's record.

`KernelLinker.link` builds a kernel's `KernelLink` (its clients' channels to every replica that
can answer); the link reports back here: IOPub status and executor changes update the
`KernelRecord`, and a cell's start delay goes to the metrics. `announce` publishes the
gateway's own status messages (``idle`` after a restart, ``dead``) to the kernel's clients.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import zmq.asyncio
from jupyter_client.session import Session

from kernelfleet.errors import KernelDead
from kernelfleet.gateway.cells import Assignment, Cell
from kernelfleet.gateway.channels import KernelLink
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.framing import KernelMessage, kernel_message_from_dict
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import CellRecord, KernelRecord
from kernelfleet.gateway.replication import ask_outcome

log = logging.getLogger("kernelfleet.gateway.kernels")

ANNOUNCED_STATES = frozenset({"idle", "dead"})
"""The statuses the gateway publishes itself. Never ``restarting``: frontends take that one for
a crash the server recovered from (JupyterLab shows "The kernel appears to have died"), which
jupyter_server sends only when a kernel died and was restarted without being asked to."""


class CellAssigner(Protocol):
    """Who chooses where each cell runs (the `ExecutorChooser`)."""

    async def assign(self, kernel: KernelRecord, cell: Cell) -> Assignment:
        """The replica and GPUs of `cell`, once it may run (see `CellQueue`'s `Assign`)."""
        ...


class KernelLinker:
    """Links kernels to their replicas; see the module docstring."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        assigner: CellAssigner,
        metrics: FleetMetrics,
        launch_timeout: float,
        events: EventBus | None = None,
        fence: Callable[[KernelRecord, str, float], None] | None = None,
    ) -> None:
        self._fence = fence
        """Told ``(kernel, replica_id, seconds)`` when a replica's heartbeat went silent."""
        self._context = context
        self._assigner = assigner
        self._metrics = metrics
        self._events = events or EventBus()
        self._launch_timeout = launch_timeout
        self._status_session = Session(username="kernelfleet")

    async def link(self, kernel: KernelRecord, why: str = "the kernel restarted") -> None:
        """Link the kernel to its live replicas. Clients of the previous link are told `why`
        for any cell still running, then disconnected so that they reconnect. `KernelDead` if
        no replica can answer; the kernel is ``idle`` once linked."""
        if kernel.link is not None:
            kernel.link.close(why)
        live = kernel.linkable_replicas()
        if not live:
            raise KernelDead(f"kernel {kernel.id} is dead: restart it or shut it down")
        link = KernelLink(
            kernel.id,
            self._context,
            functools.partial(self._on_iopub, kernel),
            functools.partial(self._assigner.assign, kernel),
            KernelCells(kernel, self._metrics, self._events),
        )
        link.ask_outcome = functools.partial(ask_outcome, self._context)
        if self._fence is not None:
            link.on_silent = functools.partial(self._fence, kernel)
        kernel.link = link
        # The last executor first: it is the primary, which answers everything but cells.
        live.sort(key=lambda replica: replica.id != kernel.executor)
        try:
            await link.add_replica(live[0].id, live[0].connection, self._launch_timeout)
            results = await asyncio.gather(
                *(link.add_replica(r.id, r.connection, self._launch_timeout) for r in live[1:]),
                return_exceptions=True,
            )
        except BaseException:
            link.close(why)
            raise
        for replica, result in zip(live[1:], results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "kernel %s: replica %s is not linked: %s", kernel.id, replica.id, result
                )
        kernel.execution_state = "idle"

    def announce(self, kernel: KernelRecord, execution_state: str) -> None:
        """Publish a status message of the gateway's own to the kernel's clients: ``idle``
        (a restart is done) or ``dead`` (the kernel is gone: JupyterLab then shows it dead and
        stops using the connection). `ValueError` for any other state (`ANNOUNCED_STATES`)."""
        if execution_state not in ANNOUNCED_STATES:
            raise ValueError(f"the gateway does not announce {execution_state!r} itself")
        if kernel.link is None:
            return
        msg = self._status_session.msg("status", content={"execution_state": execution_state})
        kernel.link.broadcast("iopub", kernel_message_from_dict(msg))

    def _on_iopub(self, kernel: KernelRecord, replica_id: str, message: KernelMessage) -> None:
        kernel.last_activity = datetime.now(UTC)
        if message.msg_type == "status":
            try:
                kernel.execution_state = json.loads(message.raw_content)["execution_state"]
            except (ValueError, KeyError, TypeError):
                log.warning("kernel %s sent a status message without execution_state", kernel.id)
        elif message.msg_type == "execute_input":
            kernel.executor = replica_id
            if kernel.link is not None:
                kernel.link.set_primary(replica_id)


class KernelCells:
    """A kernel's `CellWatcher`: each cell's start delay goes to the metrics, its record to the
    kernel's `recent_cells`, and its arrival, start and end to the fleet events. Cheap appends
    only: it runs on the cell's path."""

    def __init__(self, kernel: KernelRecord, metrics: FleetMetrics, events: EventBus) -> None:
        self._kernel = kernel
        self._metrics = metrics
        self._events = events

    def cell_queued(self, cell: Cell, queued: int) -> None:
        self._kernel.recent_cells.append(CellRecord(cell.id, time.time(), gpus=cell.gpus))
        self._events.publish(
            EventType.CELL_QUEUED,
            {"cell_id": cell.id, "gpus": cell.gpus, "queued": queued},
            kernel_id=self._kernel.id,
        )

    def cell_started(self, cell: Cell, assignment: Assignment) -> None:
        """Its start delay is the time since the gateway got it."""
        now = time.monotonic()
        delay = now - cell.received_at
        cell.started_at = now
        self._metrics.cell_start_delay.observe(delay)
        record = self._kernel.recent_cell(cell.id)
        if record is not None:
            record.started_at = time.time()
            record.gpus, record.host = cell.gpus_used, cell.host_id
            record.devices = assignment.devices
            record.start_delay_s, record.waited, record.moved_to = delay, cell.waited, cell.moved_to
        self._events.publish(
            EventType.CELL_STARTED,
            {
                "cell_id": cell.id,
                "replica_id": assignment.replica_id,
                "gpus": cell.gpus_used,
                "devices": list(assignment.devices),
                "start_delay_s": delay,
                "waited": cell.waited,
                "moved_to": cell.moved_to,
            },
            kernel_id=self._kernel.id,
            host_id=cell.host_id,
        )

    def cell_finished(self, cell: Cell) -> None:
        duration = None if cell.started_at is None else time.monotonic() - cell.started_at
        record = self._kernel.recent_cell(cell.id)
        if record is not None:
            record.outcome, record.duration_s = cell.outcome.value, duration
        self._events.publish(
            EventType.CELL_FINISHED,
            {"cell_id": cell.id, "outcome": cell.outcome.value, "duration_s": duration},
            kernel_id=self._kernel.id,
            host_id=cell.host_id,
        )
