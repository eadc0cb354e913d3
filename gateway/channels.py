"""The gateway's ZMQ links to a kernel's replicas.

`KernelLink` holds one IOPub subscription per live replica (`ReplicaFeed`), made ready once (by
nudging the replica until a message arrives) and fanned out to every attached client, so a
websocket that opens can execute at once without losing the first outputs. Each attached client
gets its own DEALER sockets for shell, control and stdin to each replica (`ClientLink`), so
replies route back to the client that asked. Each request is answered by one replica, and only
that replica's messages about it are relayed. Messages from the kernel are HMAC-checked; a bad
one is logged and dropped, never relayed.

Comm messages are booked in the link's `CommTable` (`kernelfleet.gateway.comms`): a comm lives
on one replica, and is closed for the frontends when the executor moves off it. A
``shutdown_request`` on control stops the whole kernel (or restarts it, for ``restart: true``)
through the link's `KernelLifecycle`, answered as a plain kernel answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from kernelfleet.errors import InvalidRequest, KernelDead, KernelStartFailed
from kernelfleet.gateway.cells import (
    Assign,
    Assignment,
    Cell,
    CellOutcome,
    CellQueue,
    CellWatcher,
    cell_gpus,
    stage_stamp,
    stops_on_error,
)
from kernelfleet.gateway.comms import COMM_TYPES, CommTable, comm_id_of
from kernelfleet.gateway.framing import (
    DELIMITER,
    ClientMessage,
    KernelMessage,
    kernel_message_from_dict,
    parse_kernel_frames,
)
from kernelfleet.gateway.replica_watch import HeartbeatWatch
from kernelfleet.gateway.wait_notice import WaitNotice
from kernelfleet.protocol import (
    METADATA_KEY,
    CellKey,
    ConnectionInfo,
    ErrorName,
    Role,
    options_of,
)

log = logging.getLogger("kernelfleet.gateway.channels")

Deliver = Callable[[str, KernelMessage], None]
"""Receives (channel, message) for each verified message from the kernel."""

OnClosed = Callable[[], None]
"""Called when the gateway closes a client's link (the kernel was restarted or shut down)."""

ROUTES_KEPT = 4096
"""Requests whose answering replica is remembered (late output of old cells included)."""


AskOutcome = Callable[[ConnectionInfo, str, int], Awaitable[dict[str, Any]]]
"""``(replica, cell_id, attempt) -> the replica's outcome reply`` (`Request.OUTCOME`)."""


class KernelLifecycle(Protocol):
    """Who stops and restarts a whole kernel (the `KernelService`), for a client's
    ``shutdown_request``."""

    async def shutdown(self, kernel_id: str) -> None: ...

    async def restart(self, kernel_id: str) -> Any: ...


def replica_session(info: ConnectionInfo, session_id: str | None = None) -> Session:
    """A session that signs messages to the replica at `info`, and checks the replica's."""
    return Session(
        key=info.key.encode(),
        signature_scheme=info.signature_scheme,
        session=session_id or str(uuid.uuid4()),
        username="kernelfleet",
    )


class ReplicaFeed:
    """One replica's IOPub subscription, made to work before it is used (see `nudge`)."""

    def __init__(
        self,
        kernel_id: str,
        replica_id: str,
        info: ConnectionInfo,
        context: zmq.asyncio.Context,
        on_message: Callable[[str, KernelMessage], None],
        on_silent: Callable[[str, float], None] | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.replica_id = replica_id
        self.info = info
        self._context = context
        self._on_message = on_message
        self._session = replica_session(info)
        self._socket: zmq.asyncio.Socket | None = None
        self._pump: asyncio.Task[None] | None = None
        self._first = asyncio.Event()
        self._watch = (
            HeartbeatWatch(context, info, functools.partial(on_silent, replica_id))
            if on_silent is not None
            else None
        )

    async def start(self, timeout: float = 10.0) -> None:
        """Subscribe to IOPub and nudge the replica until the subscription demonstrably works;
        then watch its heartbeat (`HeartbeatWatch`), if asked to."""
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(self.info.url("iopub"))
        self._pump = asyncio.create_task(self._run(), name=f"iopub-{self.replica_id}")
        await self.nudge(timeout)
        if self._watch is not None:
            self._watch.start()

    async def nudge(self, timeout: float = 10.0) -> None:
        """Send ``kernel_info_request`` until something arrives on IOPub.

        Needed after subscribing, and again after the kernel process was replaced on the same
        ports (a restart): ZMQ reconnects the subscription by itself, but what the new process
        publishes before that reconnection is lost.
        """
        self._first.clear()
        nudge = self._context.socket(zmq.DEALER)
        nudge.setsockopt(zmq.LINGER, 0)
        nudge.connect(self.info.url("shell"))
        deadline = time.monotonic() + timeout
        try:
            while not self._first.is_set():
                if time.monotonic() > deadline:
                    raise KernelStartFailed(
                        f"kernel {self.kernel_id} published nothing on IOPub within {timeout:.0f} s"
                    )
                msg = self._session.msg("kernel_info_request")
                await nudge.send_multipart(self._session.serialize(msg))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._first.wait(), 0.2)
        finally:
            nudge.close()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self._pump is not None:
            self._pump.cancel()
        if self._socket is not None:
            self._socket.close()

    async def _run(self) -> None:
        assert self._socket is not None
        async for message in _verified_messages(
            self._socket, self._session, self.kernel_id, "iopub"
        ):
            self._first.set()
            self._on_message(self.replica_id, message)


class KernelLink:
    """The gateway side of one kernel's channels, across its live replicas.

    Each client request is routed to one replica, and only that replica's answers reach the
    clients: its replies, and the IOPub messages whose parent is the request. IOPub messages
    with no routed parent come from the `primary` replica (the last executor) alone. Cells go
    through `cells`, the kernel's `CellQueue`: each is sent with the LEAD role to the replica
    assigned to it and with the YIELD role to the others, which answer with an aborted reply.

    Create, `await add_replica(...)` for each live replica, then `attach` clients.
    """

    def __init__(
        self,
        kernel_id: str,
        context: zmq.asyncio.Context,
        on_iopub: Callable[[str, KernelMessage], None],
        assign: Assign,
        watcher: CellWatcher | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self._context = context
        self._on_iopub = on_iopub
        self.feeds: dict[str, ReplicaFeed] = {}
        self.primary: str | None = None
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._clients: set[ClientLink] = set()
        self.cells = CellQueue(kernel_id, assign, self._dispatch_cell, watcher)
        self.comms = CommTable(kernel_id)
        self.lifecycle: KernelLifecycle | None = None
        """Set by whoever owns the kernel; without it a ``shutdown_request`` reaches the
        primary replica alone."""
        self.on_silent: Callable[[str, float], None] | None = None
        """Told ``(replica_id, seconds)`` when a linked replica's heartbeat went silent (set
        by the linker): a frozen replica, to be fenced."""
        self.ask_outcome: AskOutcome | None = None
        """Asks a live replica whether a cell its lost executor ran completed (set by the
        linker); without it such a cell fails as lost."""
        self._settling: set[asyncio.Task[None]] = set()
        self._idle_owed: dict[str, tuple[str, bytes]] = {}
        """Cell id -> (its executor, its raw header) until the executor's ``idle`` for it
        came: a replica lost between a cell's reply and its idle leaves its clients waiting."""
        self._stopping: asyncio.Task[None] | None = None

    async def add_replica(self, replica_id: str, info: ConnectionInfo, timeout: float) -> None:
        """Subscribe to a live replica and open every client's sockets to it."""
        feed = ReplicaFeed(
            self.kernel_id, replica_id, info, self._context, self._from_replica, self._silent
        )
        try:
            await feed.start(timeout)
        except BaseException:
            feed.close()
            raise
        self.feeds[replica_id] = feed
        if self.primary is None:
            self.primary = replica_id
        for client in self._clients:
            client.open_replica(replica_id, info)

    def _silent(self, replica_id: str, seconds: float) -> None:
        if self.on_silent is not None and replica_id in self.feeds:
            self.on_silent(replica_id, seconds)

    def remove_replica(self, replica_id: str, why: str) -> None:
        """Stop using a lost (or moved) replica: requests it was answering get an error reply
        saying `why`; its cell, if it ran one, ends."""
        feed = self.feeds.pop(replica_id, None)
        if feed is not None:
            feed.close()
        current = self.cells.current
        attempts = {current.id: current.attempt} if current is not None else {}
        resent = self.cells.replica_lost(replica_id)
        unanswered = {
            msg_id for client in self._clients for msg_id in client.cells_pending_on(replica_id)
        } - {resent}
        settle = unanswered if self.feeds and self.ask_outcome is not None else set()
        if self.feeds:
            why += "; the kernel goes on with the state of its last completed cell"
        keep = settle | ({resent} if resent is not None else set())
        for client in list(self._clients):
            client.fail_pending(why, replica_id, keep=keep)
            client.close_replica(replica_id)
        for cell_id, (on, raw_header) in list(self._idle_owed.items()):
            if on == replica_id:
                del self._idle_owed[cell_id]
                if cell_id not in keep | unanswered:  # answered: only its idle never came
                    parent = json.loads(raw_header)
                    for client in list(self._clients):
                        client.publish_status("idle", parent)
        for cell_id in settle:
            attempt = attempts.get(cell_id, 0)
            task = asyncio.ensure_future(self._settle_lost_cell(cell_id, attempt, replica_id, why))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        if self.primary == replica_id:
            self.primary = next(iter(self.feeds), None)
        self._close_stranded_comms()

    async def _settle_lost_cell(
        self, cell_id: str, attempt: int, replica_id: str, why: str
    ) -> None:
        """Answer a cell whose executor was lost as it really ended: if its state delta got
        into the Raft log (a live replica says so, after committing an entry of its own), it
        completed and its effects are in every replica, so it is answered ``ok`` with a note
        that its output was lost; otherwise it failed, with no effect."""
        completed, count = False, None
        survivor = next(iter(self.feeds.values()), None)
        try:
            if survivor is None or self.ask_outcome is None:
                raise KernelDead("no live replica to ask")
            answer = await self.ask_outcome(survivor.info, cell_id, attempt)
        except Exception as e:  # no majority, or the survivor went too
            log.warning("kernel %s: outcome of cell %s unknown: %s", self.kernel_id, cell_id, e)
            why += "; whether the cell completed before that is unknown"
        else:
            completed, count = bool(answer.get("completed")), answer.get("execution_count")
            why += "" if completed else "; the cell's effects are not kept"
        for client in list(self._clients):
            if completed:
                client.answer_completed(cell_id, replica_id, count)
            else:
                client.fail_pending(why, replica_id, only=cell_id)

    def set_primary(self, replica_id: str) -> None:
        if replica_id in self.feeds and replica_id != self.primary:
            self.primary = replica_id
            self._close_stranded_comms()

    def _close_stranded_comms(self) -> None:
        """Tell the clients of each comm held by a replica other than the executor that it
        is closed (`CommTable.executor_changed`)."""
        for comm_id in self.comms.executor_changed(self.primary, set(self.feeds)):
            self.broadcast("iopub", self.comms.close_message(comm_id))

    def stop_kernel(self, restart: bool) -> None:
        """A client asked on control to shut the kernel down (or restart it): the whole
        kernel, through `lifecycle`, in the background (this link closes on the way)."""
        lifecycle = self.lifecycle
        if lifecycle is None or (self._stopping is not None and not self._stopping.done()):
            return
        call = lifecycle.restart if restart else lifecycle.shutdown
        self._stopping = asyncio.ensure_future(self._stop(call, restart))

    async def _stop(self, call: Callable[[str], Any], restart: bool) -> None:
        try:
            await call(self.kernel_id)
        except Exception:
            what = "restart" if restart else "shutdown"
            log.exception("kernel %s: the %s a client asked for failed", self.kernel_id, what)

    async def nudge(self, timeout: float) -> None:
        """Nudge every replica's subscription (after a restart on the same ports)."""
        await asyncio.gather(*(feed.nudge(timeout) for feed in self.feeds.values()))

    def route(self, msg_id: str, replica_id: str) -> None:
        self._routes[msg_id] = replica_id
        while len(self._routes) > ROUTES_KEPT:
            self._routes.popitem(last=False)

    def route_of(self, msg_id: str | None) -> str | None:
        """The replica that answers request `msg_id` (None for a request not routed here)."""
        return self._routes.get(msg_id) if msg_id else None

    def attach(self, session_id: str, deliver: Deliver, on_closed: OnClosed) -> ClientLink:
        """Open a client's shell/control/stdin sockets; IOPub reaches it through `deliver` too.

        `on_closed` runs if the link closes the client (a restart or a shutdown), so the client
        can drop its websocket and reconnect; it does not run when the client closes itself.
        """
        client = ClientLink(self, session_id, deliver, on_closed)
        self._clients.add(client)
        for replica_id, feed in self.feeds.items():
            client.open_replica(replica_id, feed.info)
        for comm_id in self.comms.closed_earlier():  # it may hold them from before
            deliver("iopub", self.comms.close_message(comm_id))
        return client

    def detach(self, client: ClientLink) -> None:
        self._clients.discard(client)

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def broadcast(self, channel: str, message: KernelMessage) -> None:
        for client in list(self._clients):
            client.deliver(channel, message)

    def close(
        self,
        why: str = "the kernel's link closed",
        ename: str = ErrorName.REPLICA_LOST,
        last_status: str | None = None,
    ) -> None:
        """Close the link: cells not yet run and each client's running cells get an error
        saying `why` (the running ones under `ename`); each client then gets the status
        `last_status` (``dead`` for a kernel that is gone), if any, and is disconnected."""
        self.cells.close(why)
        for client in list(self._clients):
            client.fail_pending(why, ename=ename)
            if last_status is not None:
                client.publish_status(last_status)
            client.close()
            client.on_closed()
        for feed in self.feeds.values():
            feed.close()
        self.feeds.clear()
        self._idle_owed.clear()

    def _from_replica(self, replica_id: str, message: KernelMessage) -> None:
        parent = message.parent_msg_id()
        owner = self.route_of(parent)
        if owner != replica_id and (owner is not None or replica_id != self.primary):
            return  # a yielding replica's echo, or a replica that answers nobody
        if parent is not None and message.msg_type == "execute_input":
            self.cells.mark_running(parent, replica_id)
        elif message.msg_type == "status" and parent and b'"idle"' in message.raw_content:
            stage_stamp(parent, "idle_in")
            self.cells.finish_idle(parent, replica_id)
            if self._idle_owed.get(parent, ("",))[0] == replica_id:
                del self._idle_owed[parent]
        if message.msg_type in COMM_TYPES:
            self.comms.kernel_sent(message.msg_type, message.raw_content, replica_id)
        self._on_iopub(replica_id, message)
        self.broadcast("iopub", message)

    async def _dispatch_cell(self, cell: Cell, assignment: Assignment) -> None:
        self.route(cell.id, assignment.replica_id)
        self._idle_owed[cell.id] = (assignment.replica_id, cell.message.parts[0])
        await cell.client.send_cell(
            cell, assignment, [r for r in self.feeds if r != assignment.replica_id]
        )


class ClientLink:
    """One websocket client's DEALER sockets to each replica of a kernel."""

    def __init__(
        self, link: KernelLink, session_id: str, deliver: Deliver, on_closed: OnClosed
    ) -> None:
        self._link = link
        self.deliver = deliver
        self.on_closed = on_closed
        self._session = Session(session=session_id, username="kernelfleet")
        self._identity = f"{session_id}-{uuid.uuid4().hex[:8]}".encode()
        self._pending: dict[str, tuple[bytes, str]] = {}  # execute msg_id -> raw header, replica
        self._sockets: dict[str, dict[str, zmq.asyncio.Socket]] = {}
        self._signers: dict[str, Session] = {}
        self._pumps: dict[str, list[asyncio.Task[None]]] = {}
        self._stdin_replica: str | None = None
        self._notices: dict[str, WaitNotice] = {}  # cell id -> its notice, while it waits
        self._closed = False

    def open_replica(self, replica_id: str, info: ConnectionInfo) -> None:
        if self._closed or replica_id in self._sockets:
            return
        context = self._link._context
        self._signers[replica_id] = replica_session(info, self._session.session)
        sockets: dict[str, zmq.asyncio.Socket] = {}
        pumps = []
        for channel in ("shell", "control", "stdin"):
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IDENTITY, self._identity)
            socket.connect(info.url(channel))
            sockets[channel] = socket
            pumps.append(asyncio.create_task(self._pump(replica_id, channel, socket)))
        self._sockets[replica_id] = sockets
        self._pumps[replica_id] = pumps

    def close_replica(self, replica_id: str) -> None:
        for task in self._pumps.pop(replica_id, []):
            task.cancel()
        for socket in self._sockets.pop(replica_id, {}).values():
            socket.close()
        self._signers.pop(replica_id, None)

    async def send(self, message: ClientMessage) -> None:
        """Route `message`: a cell to the kernel's cell queue, an input reply to the replica
        that asked for input, anything else to the primary replica."""
        if message.channel not in ("shell", "control", "stdin"):
            raise InvalidRequest(f"cannot send on channel {message.channel!r}")
        if message.channel == "shell" and message.msg_type == "execute_request":
            self._submit_cell(message)
            return
        if message.msg_type == "interrupt_request":
            self._link.cells.cancel_waiting("interrupted while waiting to run")
        stops = message.channel == "control" and message.msg_type == "shutdown_request"
        if stops and self._link.lifecycle is not None:
            self._shutdown_kernel(message)
            return
        comm = message.msg_type in COMM_TYPES
        if comm:
            unknown = self._link.comms.unknown(message.msg_type, message.parts[3])
            if unknown is not None:  # no replica would answer: the frontend hears it is closed
                parent = json.loads(message.parts[0])
                self.deliver("iopub", self._link.comms.close_message(unknown, parent))
                return
        target = self._target(message)
        if target is None:
            raise KernelDead(f"kernel {self._link.kernel_id} has no live replica")
        if comm:
            self._link.comms.client_sent(message.msg_type, message.parts[3], target)
        self._link.route(message.msg_id, target)
        await self._send_to(target, message.channel, message.parts, message.buffers)

    def _shutdown_kernel(self, message: ClientMessage) -> None:
        """Answer a ``shutdown_request`` as a plain kernel does (``shutdown_reply`` on control
        and on IOPub), then stop or restart the whole kernel (`KernelLink.stop_kernel`)."""
        try:
            content = json.loads(message.parts[3])
        except ValueError:
            content = {}
        restart = bool(content.get("restart", False)) if isinstance(content, dict) else False
        parent = json.loads(message.parts[0])
        reply = {"status": "ok", "restart": restart}
        self._publish("shutdown_reply", reply, parent, channel="control")
        self._link.broadcast(
            "iopub",
            kernel_message_from_dict(self._session.msg("shutdown_reply", reply, parent)),
        )
        self._link.stop_kernel(restart)

    async def send_cell(self, cell: Cell, assignment: Assignment, yielders: list[str]) -> None:
        """Send `cell` with the LEAD role to its replica and the YIELD role to `yielders`."""
        message = cell.message
        executor = assignment.replica_id
        self._clear_notice(cell)  # before the replica's first output
        self._pending[message.msg_id] = (message.parts[0], executor)
        lead = _with_role(
            message.parts, Role.LEAD, executor, cell.attempt, assignment.devices, cell.excluded
        )
        # Stamped as the LEAD is handed to zmq: after the send, the replica's own stamp of its
        # arrival may come first (the send may yield to the loop), and a stage would go negative.
        stage_stamp(cell.id, "lead_sent")
        await self._send_to(executor, "shell", lead, message.buffers)
        yielding = _with_role(message.parts, Role.YIELD, executor, cell.attempt, ())
        for replica_id in yielders:
            with contextlib.suppress(KeyError, zmq.ZMQError):
                await self._send_to(replica_id, "shell", yielding, message.buffers)
        stage_stamp(cell.id, "yields_sent")

    def show_cell_status(self, cell: Cell, text: str) -> None:
        """Show `text` in the output of a cell that waits in the gateway: a transient display,
        updated in place at most once a second, and removed when the cell is sent to its
        replica or ends unsent (`kernelfleet.gateway.wait_notice`)."""
        notice = self._notices.get(cell.id)
        if notice is None:
            parent = json.loads(cell.message.parts[0])
            notice = WaitNotice(
                f"kernelfleet-{cell.id}",
                lambda msg_type, content: self._publish(msg_type, content, parent),
            )
            self._notices[cell.id] = notice
        notice.show(text)

    def _clear_notice(self, cell: Cell) -> None:
        notice = self._notices.pop(cell.id, None)
        if notice is not None:
            notice.clear()

    def end_unsent_cell(self, cell: Cell, ename: str, why: str) -> None:
        """Answer a cell that never ran: an error reply (aborted for ``ename == "aborted"``)."""
        self._clear_notice(cell)
        parent = json.loads(cell.message.parts[0])
        if ename == "aborted":
            reply: dict[str, Any] = {"status": "aborted", "execution_count": None}
        else:
            reply = _error_reply(ename, why)
            self._publish("error", {k: reply[k] for k in ("ename", "evalue", "traceback")}, parent)
        self._publish("execute_reply", reply, parent, channel="shell")
        self._publish("status", {"execution_state": "idle"}, parent)

    def fail_pending(
        self,
        why: str,
        replica_id: str | None = None,
        keep: set[str] | frozenset[str] = frozenset(),
        ename: str = ErrorName.REPLICA_LOST,
        only: str | None = None,
    ) -> None:
        """Answer every cell this client still waits for (on `replica_id`, or anywhere; but
        those in `keep`: sent again, or still being settled; or just `only`) as a kernel
        answers a failed cell: an IOPub ``error`` (what frontends show in the cell's output),
        an error ``execute_reply`` (`ename`, `why`), then an ``idle`` status."""
        for msg_id, (raw_header, on) in list(self._pending.items()):
            if (replica_id is not None and on != replica_id) or msg_id in keep:
                continue
            if only is not None and msg_id != only:
                continue
            del self._pending[msg_id]
            parent = json.loads(raw_header)
            reply = _error_reply(ename, why)
            self._publish("error", {k: reply[k] for k in ("ename", "evalue", "traceback")}, parent)
            self._publish("execute_reply", reply, parent, channel="shell")
            self._publish("status", {"execution_state": "idle"}, parent)

    def cells_pending_on(self, replica_id: str) -> list[str]:
        """The cells this client sent to `replica_id` and still waits for the reply of."""
        return [msg_id for msg_id, (_, on) in self._pending.items() if on == replica_id]

    def answer_completed(self, msg_id: str, replica_id: str, execution_count: Any) -> None:
        """Answer a cell that completed on `replica_id`, lost since, before its reply came:
        a note on stderr (its output after the loss is gone), an ``ok`` reply, ``idle``."""
        pending = self._pending.pop(msg_id, None)
        if pending is None:
            return
        parent = json.loads(pending[0])
        note = (
            f"kernelfleet: replica {replica_id}, which ran this cell, was lost after the cell "
            "completed: its effects are kept in every replica, the rest of its output is lost\n"
        )
        self._publish("stream", {"name": "stderr", "text": note}, parent)
        reply = {"status": "ok", "execution_count": execution_count, "user_expressions": {}}
        self._publish("execute_reply", reply, parent, channel="shell")
        self._publish("status", {"execution_state": "idle"}, parent)

    def publish_status(self, execution_state: str, parent: dict | None = None) -> None:
        """Send this client a status message of the gateway's own (for request `parent`, or
        none)."""
        self._publish("status", {"execution_state": execution_state}, parent or {})

    def close(self) -> None:
        self._closed = True
        for notice in self._notices.values():
            notice.cancel()
        self._notices.clear()
        self._link.detach(self)
        self._link.cells.client_gone(self)
        for replica_id in list(self._sockets):
            self.close_replica(replica_id)

    def _submit_cell(self, message: ClientMessage) -> None:
        cell = Cell(message, self, None, stops_on_error(message), time.monotonic())
        stage_stamp(cell.id, "received")
        try:
            cell.gpus = cell_gpus(message)
        except InvalidRequest as e:
            self.end_unsent_cell(cell, type(e).__name__, e.message)
            return
        self._link.cells.submit(cell)

    def _target(self, message: ClientMessage) -> str | None:
        link = self._link
        if message.channel == "stdin" and self._stdin_replica in link.feeds:
            return self._stdin_replica
        if message.msg_type in COMM_TYPES:
            held_by = link.comms.replica_of(comm_id_of(message.parts[3]) or "")
            if held_by in link.feeds:
                return held_by
        running = link.cells.current_assignment
        if message.channel == "control" and running is not None:
            return running.replica_id
        return link.primary

    async def _send_to(
        self, replica_id: str, channel: str, parts: list[bytes], buffers: list[bytes]
    ) -> None:
        socket = self._sockets[replica_id][channel]
        signature = self._signers[replica_id].sign(parts)
        await socket.send_multipart([DELIMITER, signature, *parts, *buffers])

    def _publish(
        self, msg_type: str, content: dict[str, Any], parent: dict, channel: str = "iopub"
    ) -> None:
        msg = self._session.msg(msg_type, content=content, parent=parent)
        self.deliver(channel, kernel_message_from_dict(msg))

    async def _pump(self, replica_id: str, channel: str, socket: zmq.asyncio.Socket) -> None:
        link = self._link
        session = self._signers[replica_id]
        async for message in _verified_messages(socket, session, link.kernel_id, channel):
            parent = message.parent_msg_id()
            owner = link.route_of(parent)
            if owner is not None and owner != replica_id:
                continue  # a yielding replica's reply
            if channel == "stdin":
                self._stdin_replica = replica_id
            if channel == "shell" and message.msg_type == "execute_reply" and parent:
                outcome = _reply_outcome(message)
                if outcome is None:
                    continue  # a YIELD's answer, possibly to an earlier attempt: never relayed
                if outcome is CellOutcome.RETRY:
                    link.cells.finish(parent, outcome, replica_id)
                    continue  # the cell goes to another replica; its reply will come from there
                self._pending.pop(parent, None)
                stage_stamp(parent, "execute_reply_in")
                link.cells.finish(parent, outcome, replica_id)
            self.deliver(channel, message)


def _with_role(
    parts: list[bytes],
    role: Role,
    executor: str,
    attempt: int,
    devices: tuple[str, ...],
    superseded: set[str] | frozenset[str] = frozenset(),
) -> list[bytes]:
    """`parts` with the cell's role, attempt (how many times it was sent again), the replicas
    earlier attempts went to and, for the executor, its GPU devices in the metadata."""
    metadata = json.loads(parts[2])
    if not isinstance(metadata, dict):
        metadata = {}
    options = dict(options_of(metadata))
    options[CellKey.ROLE.value] = role.value
    options[CellKey.EXECUTOR.value] = executor
    options[CellKey.ATTEMPT.value] = attempt
    options[CellKey.DEVICES.value] = list(devices)
    options[CellKey.SUPERSEDED.value] = sorted(superseded)
    metadata[METADATA_KEY] = options
    return [parts[0], parts[1], json.dumps(metadata).encode(), parts[3]]


def _reply_outcome(message: KernelMessage) -> CellOutcome | None:
    """What an execute_reply means for its cell: None for a replica's answer to a YIELD (never
    relayed), `CellOutcome.RETRY` for a replica that could not reach its group, else the
    outcome of its status."""
    try:
        content = json.loads(message.raw_content)
        if options_of(content).get(CellKey.ROLE) == Role.YIELD:
            return None
        if content.get("ename") == ErrorName.REPLICA_ISOLATED:
            return CellOutcome.RETRY
        return CellOutcome.of_reply(str(content.get("status", "ok")))
    except (ValueError, AttributeError):
        return CellOutcome.OK


async def _verified_messages(
    socket: zmq.asyncio.Socket, session: Session, kernel_id: str, channel: str
):
    """Yield each message that arrives on `socket` and passes its HMAC check; log the others."""
    while True:
        try:
            frames = await socket.recv_multipart()
        except (asyncio.CancelledError, zmq.ZMQError):
            return
        try:
            message = parse_kernel_frames(frames, session.auth)
        except InvalidRequest as e:
            log.error(
                "kernel %s sent an invalid message on %s (%s): %s", kernel_id, channel, e.reason, e
            )
            continue
        yield message


def _error_reply(ename: str, evalue: str) -> dict[str, Any]:
    return {
        "status": "error",
        "ename": ename,
        "evalue": evalue,
        "traceback": [f"{ename}: {evalue}"],
        "execution_count": None,
    }
