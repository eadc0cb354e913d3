"""ReplicatedKernel: an ipykernel whose namespace follows its kernel's Raft log.

Each replica of a kernel runs this kernel; the messages it answers, their channels and their
contents are in `kernelfleet.protocol`. Until the gateway sends `Request.JOIN` it is a plain
IPython kernel. The join (on shell, so it runs on the main thread, where the Raft log's
callbacks then arrive) is answered once the group has a leader. `Request.MEMBERSHIP` (control,
so a running cell does not hold it up) changes the group through this member, removals first;
a replacement replica joins after it was added, with the members as its peers. After joining:

- before it runs a cell, the replica commits a LEAD `Proposal` for it. That records who ran the
  cell and is a barrier: the append returns only once every earlier entry, every earlier
  cell's delta included, has been applied here. A replica that cannot reach a majority of its
  group refuses the cell instead of running it on stale state;
- after each cell it ran, the replica commits the cell's namespace delta as a `StateDelta`
  before its ``execute_reply`` goes out: an ``ok`` reply means the effects are in the log;
- a replica whose LEAD is in the log owes a `StateDelta` until it commits. Before a cell runs,
  the replica waits until no replica owes one, so cell N+1 never runs without cell N's state;
  if the owing replica died before publishing, it waits `OWED_DELTA_WAIT` seconds, then goes
  on from the last committed state and says so. `Request.FORGET` (control) says which
  replicas are lost, so nobody waits for what they owed;
- once a cell's reply is out, a replica that ran it and does not lead its Raft group asks for
  the leadership (`leadership.LeadershipSeeker`), so that its next cells' commits skip the
  hop through another leader;
- it applies every other replica's `StateDelta` that takes effect (`DeltaOrder`: not a second
  copy, not one given up on) in log order and takes its execution count, so whichever replica
  runs the next cell holds the state of every committed cell.

Run as ``python -m kernelfleet.kernels.replica.kernel -f CONNECTION_FILE``. Before anything
else it drops from its environment what no notebook and none of its subprocesses may hold
(`NEVER_INHERITED`: the fleet token, should a launcher ever pass it on).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import IPython
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp

from kernelfleet import __version__
from kernelfleet.kernels.objectstore import LocalDirectoryStore, ObjectStore
from kernelfleet.kernels.replica.gpu_binding import GpuBinder, MoveReport
from kernelfleet.kernels.replica.leadership import LeadershipSeeker
from kernelfleet.kernels.replica.start_binding import BindRefused, bind_start
from kernelfleet.kernels.replica.statesync import NamespaceTracker, apply, encode
from kernelfleet.kernels.replica.statesync_delta import ApplyFailed, EncodedDelta
from kernelfleet.kernels.replica.statesync_gc import start_collector
from kernelfleet.protocol import (
    METADATA_KEY,
    BindContent,
    CellKey,
    Channel,
    ErrorName,
    ForgetContent,
    JoinContent,
    MembershipContent,
    OutcomeContent,
    ReplicaEnv,
    Reply,
    Request,
    Role,
    options_of,
)
from kernelfleet.raft import KernelLog, NotCommitted, Proposal, StateDelta
from kernelfleet.raft.entries import DeltaOrder
from kernelfleet.stage_log import StageLog

PUBLISH_DEADLINE = 10.0  # seconds to get a cell's delta committed (leader changes included)
LEAD_DEADLINE = 5.0  # seconds to commit the LEAD proposal before refusing the cell
MEMBERSHIP_DEADLINE = 10.0  # seconds to get a membership change through pysyncobj's refusals
OWED_DELTA_WAIT = 15.0  # seconds to wait for another replica's owed delta before going on
CELLS_REMEMBERED = 10_000  # cells whose executor is remembered, to refuse a duplicate
OUTCOME_DEADLINE = 10.0  # seconds to commit the barrier of an outcome request
RAN_ELSEWHERE_WAIT = 10.0  # seconds a resent cell waits for the delta of the replica that ran it
MAGICS_EXTENSION = "kernelfleet.kernels.magics"  # %fleet, %gpus and the tools' magics
UNSUPPORTED_FEATURES = ("kernel subshells", "debugger")
"""ipykernel features a replica does not advertise in ``supported_features``
(docs/conformance.md): a subshell would exist on one replica only, and the debugger's
breakpoints and stopped threads would stay on the replica that ran the last cell."""
SUBSHELL_REQUESTS = ("create_subshell_request", "delete_subshell_request", "list_subshell_request")
SUBSHELLS_UNSUPPORTED = "SubshellsUnsupported"
"""The ``ename`` of the error reply to a subshell request."""
NEVER_INHERITED = ("KERNELFLEET_TOKEN",)
"""Variables a replica removes from its environment at start: the fleet (admin) token, which
the host agent never passes on; the replica drops it too, whoever launched it."""


@dataclass
class _Group:
    """What a replica holds once it joined its kernel's Raft group."""

    raft: KernelLog
    tracker: NamespaceTracker
    store: ObjectStore
    loop: asyncio.AbstractEventLoop
    """The main thread's loop: the log's callbacks and calls belong there."""
    leadership: LeadershipSeeker
    """Makes the replica that runs the cells its group's Raft leader."""


stage_stamp = StageLog("replica").stamp
"""Stamp a stage of a cell's path in the stage log (`kernelfleet.stage_log`), if it is on."""


def hold_port(address: str) -> socket.socket | None:
    """Bind ``host:port`` (no listening) so that no other process takes the port before this
    replica's Raft log binds it, when it joins its group; None for no address. `OSError`
    ("Address already in use") if it is taken: the host agent then relaunches the replica on
    new ports."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    hold = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        hold.bind((host.strip("[]"), int(port)))
    except OSError:
        hold.close()
        raise
    return hold


class ReplicatedKernel(IPythonKernel):
    """IPython's kernel, replicated. Its ``kernel_info_reply`` is IPython's (implementation
    ``ipython``, IPython's version: clients that check for IPython keep working) plus a
    ``kernelfleet`` field, ``{"version", "replicas"}`` (no help link: the project has no
    public home page to point at yet). It advertises
    neither subshells nor the debugger (`UNSUPPORTED_FEATURES`); a subshell request gets an
    error reply (`SUBSHELLS_UNSUPPORTED`), a ``debug_request`` a failed DAP response."""

    implementation = "ipython"
    implementation_version = IPython.__version__

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        handlers = {
            Request.JOIN: self.join_request,
            Request.MEMBERSHIP: self.membership_request,
            Request.FORGET: self.forget_request,
            Request.STATUS: self.status_request,
            Request.RELEASE: self.gpu_release_request,
            Request.OUTCOME: self.outcome_request,
            Request.BIND: self.bind_request,
        }
        tables = {Channel.SHELL: self.shell_handlers, Channel.CONTROL: self.control_handlers}
        for request, handler in handlers.items():
            tables[request.channel][request.value] = handler
        for msg_type in SUBSHELL_REQUESTS:
            self.control_handlers[msg_type] = functools.partial(self._refuse_subshells, msg_type)
        self.gpus = GpuBinder()
        self.replica_id = os.environ.get(ReplicaEnv.REPLICA_ID, "")
        self.replica_dir = Path(os.environ.get(ReplicaEnv.REPLICA_DIR, "."))
        self.group: _Group | None = None
        self.unpublished: str | None = None
        """The cell running now, whose delta `do_execute` publishes before its reply."""
        self.order = DeltaOrder(CELLS_REMEMBERED)
        """Who led which cell, which deltas took effect, who owes one (from the log)."""
        self.forgotten: set[str] = set()  # lost replicas: whatever they owed never comes
        self.settled = asyncio.Event()
        """Set while no other replica owes a delta (`owing`)."""
        self.delta_admitted = asyncio.Event()
        """Set, and replaced by a fresh one, whenever a delta takes effect."""
        self.settled.set()
        self.raft_port_hold = hold_port(os.environ.get(ReplicaEnv.RAFT_ADDRESS, ""))
        for log_handler in self.log.handlers:  # the kernel app's own log, as kernelfleet's
            if isinstance(log_handler, logging.StreamHandler) and log_handler.stream is not None:
                log_handler.setStream(log_file())
        self._load_magics()

    def _load_magics(self) -> None:
        """Load kernelfleet's magics (`MAGICS_EXTENSION`) into the shell, as ``%load_ext``
        would: cheap, for the extension imports only what registers the magics. A tool's magic
        that fails is reported by the extension and skipped; if the extension itself fails, the
        kernel starts without magics and logs why."""
        try:
            self.user_shell.extension_manager.load_extension(MAGICS_EXTENSION)
        except Exception:
            self.log.exception("kernelfleet's magics did not load; the kernel runs without them")

    @property
    def kernel_info(self) -> dict[str, Any]:
        info = dict(super().kernel_info)
        features = info.get("supported_features", [])
        info["supported_features"] = [f for f in features if f not in UNSUPPORTED_FEATURES]
        info["debugger"] = False
        group = self.group
        replicas = len(group.raft.members) if group is not None else 1
        info["kernelfleet"] = {"version": __version__, "replicas": replicas}
        return info

    async def _refuse_subshells(self, msg_type: str, stream: Any, ident: Any, parent: dict) -> None:
        """Answer a subshell request with an error reply: subshells are not advertised."""
        why = (
            "kernelfleet kernels do not support subshells: a subshell would exist on one "
            "replica only (docs/conformance.md)"
        )
        content = {
            "status": "error",
            "ename": SUBSHELLS_UNSUPPORTED,
            "evalue": why,
            "traceback": [f"{SUBSHELLS_UNSUPPORTED}: {why}"],
        }
        assert self.session is not None
        self.session.send(stream, msg_type.replace("_request", "_reply"), content, parent, ident)

    async def do_debug_request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A failed DAP response: the debugger is not advertised (`UNSUPPORTED_FEATURES`)."""
        return {
            "type": "response",
            "request_seq": msg.get("seq", 0),
            "success": False,
            "command": msg.get("command", ""),
            "message": "kernelfleet kernels have no debugger: breakpoints would stay on one "
            "replica (docs/conformance.md)",
            "body": {},
        }

    @property
    def user_shell(self) -> Any:
        assert self.shell is not None, "the kernel's shell exists from construction on"
        return self.shell

    async def join_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Join the kernel's Raft group; reply once it has a leader (or why it could not)."""
        content: JoinContent = parent["content"]
        try:
            await self._join(content)
            reply: dict[str, Any] = {"status": "ok", "replica_id": self.replica_id}
        except Exception as e:
            self.log.exception("replica %s could not join its group", self.replica_id)
            reply = {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        assert self.session is not None
        self.session.send(stream, Reply.JOIN, reply, parent, ident)

    async def bind_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Take on the kernel start that took this pooled replica's group (`start_binding`)."""
        content: BindContent = parent["content"]
        try:
            cwd = bind_start(content.get("env"), content.get("working_dir", ""), self.replica_dir)
            reply: dict[str, Any] = {"status": "ok", "cwd": str(cwd)}
        except (BindRefused, OSError) as e:
            self.log.warning("replica %s refused a bind: %s", self.replica_id, e)
            reply = {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        assert self.session is not None
        self.session.send(stream, Reply.BIND, reply, parent, ident)

    async def membership_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Remove and add group members (control thread; the log runs on the main loop)."""
        content: MembershipContent = parent["content"]
        group = self.group
        try:
            if group is None:
                raise RuntimeError(f"replica {self.replica_id} has not joined a group")
            change = self._change_members(group, content.get("remove", []), content.get("add", []))
            members = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(change, group.loop)
            )
            reply: dict[str, Any] = {"status": "ok", "members": list(members)}
        except Exception as e:
            self.log.exception("replica %s could not change its group", self.replica_id)
            reply = {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        assert self.session is not None
        self.session.send(stream, Reply.MEMBERSHIP, reply, parent, ident)

    async def forget_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Stop waiting for deltas owed by replicas the gateway knows are lost (control thread)."""
        content: ForgetContent = parent["content"]
        lost = set(content.get("replicas", []))
        group = self.group
        if group is not None:
            group.loop.call_soon_threadsafe(self._forget, lost)
        assert self.session is not None
        self.session.send(stream, Reply.FORGET, {"status": "ok"}, parent, ident)

    async def outcome_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Whether a cell whose executor was lost completed (`Request.OUTCOME`; control
        thread, the log runs on the main loop)."""
        content: OutcomeContent = parent["content"]
        cell_id = content["cell_id"]
        group = self.group
        try:
            if group is None:
                raise RuntimeError(f"replica {self.replica_id} has not joined a group")
            barrier = Proposal(
                cell_id=cell_id,
                replica_id=self.replica_id,
                role=Role.SETTLE,
                attempt=int(content.get("attempt", 0)),
            )
            commit = group.raft.append_with_retry(barrier, time.monotonic() + OUTCOME_DEADLINE)
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(commit, group.loop))
            count = self._count_of(cell_id)
            reply: dict[str, Any] = {
                "status": "ok",
                "completed": cell_id in self.order.completed,
                "execution_count": count,
            }
        except Exception as e:
            self.log.warning(
                "replica %s: outcome of cell %s unknown: %s", self.replica_id, cell_id, e
            )
            reply = {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        assert self.session is not None
        self.session.send(stream, Reply.OUTCOME, reply, parent, ident)

    async def status_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Report this replica's view of its group and of who ran which cell (control)."""
        group = self.group
        content: dict[str, Any] = {"status": "ok", "replica_id": self.replica_id}
        if group is not None:
            raft = group.raft
            content["raft"] = {
                "address": raft.address,
                "leader": raft.leader,
                "is_leader": raft.is_leader,
                "term": raft.term,
                "members": list(raft.members),
                "applied": raft.applied_count,
            }
            content["executors"] = [[c, a, r] for (c, a), r in self.order.leads.items()]
        content["execution_count"] = self.user_shell.execution_count
        assert self.session is not None
        self.session.send(stream, Reply.STATUS, content, parent, ident)

    @property
    def owing(self) -> set[str]:
        """The replicas whose LEAD awaits their StateDelta (lost ones left out)."""
        return set(self.order.owed) - self.forgotten

    def _update_settled(self) -> None:
        if self.owing - {self.replica_id}:
            self.settled.clear()
        else:
            self.settled.set()

    def _forget(self, lost: set[str]) -> None:
        self.forgotten |= lost
        self._update_settled()

    @staticmethod
    async def _change_members(group: _Group, remove: list[str], add: list[str]) -> tuple[str, ...]:
        """Removals, then additions, each retried until `MEMBERSHIP_DEADLINE`.

        pysyncobj refuses a change (REQUEST_DENIED) while another is in flight or right after
        an election; both pass. Retrying is safe: a change already made is a no-op.
        """
        deadline = time.monotonic() + MEMBERSHIP_DEADLINE
        for change, address in [*((group.raft.remove_member, a) for a in remove),
                                *((group.raft.add_member, a) for a in add)]:  # fmt: skip
            while True:
                try:
                    await change(address)
                    break
                except NotCommitted:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        return group.raft.members

    async def _join(self, content: JoinContent) -> None:
        if self.group is not None:
            raise RuntimeError(f"replica {self.replica_id} has already joined its group")
        self.replica_id = content.get("replica_id") or self.replica_id
        self.forgotten.update(content.get("forget", []))  # before replaying the log
        shell = self.user_shell
        tracker = NamespaceTracker(shell.user_ns, hidden=shell.user_ns_hidden)
        kernel_id = os.environ.get(ReplicaEnv.KERNEL_ID) or self.replica_id
        store = LocalDirectoryStore.for_kernel(content["store_root"], kernel_id)
        os.environ[ReplicaEnv.KERNEL_STORE] = str(store.root)  # for the notebook's tools
        if self.raft_port_hold is not None:  # let the log bind it
            self.raft_port_hold.close()
            self.raft_port_hold = None
        raft = KernelLog(
            content["address"],
            list(content["peers"]),
            password=content["password"],
            data_dir=self.replica_dir / "raft",
            loop=asyncio.get_running_loop(),
            on_commit=self._on_commit,
        )
        loop = asyncio.get_running_loop()
        self.group = _Group(raft, tracker, store, loop, LeadershipSeeker(raft))
        self.object_collector = start_collector(raft, store)  # superseded objects, as leader
        shell.events.register("post_run_cell", self._notice_unsynced)
        await raft.wait_ready(timeout=float(content.get("timeout", 20)))
        self.log.info(
            "replica %s joined its group (%d peers)", self.replica_id, len(content["peers"])
        )

    async def execute_request(self, stream: Any, ident: Any, parent: dict) -> None:
        group = self.group
        options = options_of(parent.get("metadata"))
        if group is None:
            self._bind_gpus(tuple(options.get(CellKey.DEVICES) or ()))
            await super().execute_request(stream, ident, parent)
            return
        cell_id = parent["header"]["msg_id"]
        attempt = int(options.get(CellKey.ATTEMPT, 0))
        if options.get(CellKey.ROLE) == Role.YIELD:
            yielded = {CellKey.ROLE.value: Role.YIELD, CellKey.ATTEMPT.value: attempt}
            self._reply_aborted(stream, ident, parent, yielded)
            return
        if (cell_id, attempt) in self.order.leads:
            ran_on = self.order.leads[(cell_id, attempt)]
            await self._answer_ran_elsewhere(stream, ident, parent, ran_on)
            return
        stage_stamp(cell_id, "request_in")
        lead = Proposal(
            cell_id=cell_id, replica_id=self.replica_id, role=Role.LEAD, attempt=attempt
        )
        try:
            index = await group.raft.append_with_retry(lead, time.monotonic() + LEAD_DEADLINE)
            stage_stamp(cell_id, "lead_committed")
        except Exception as e:
            self.log.error("replica %s cannot lead cell %s: %s", self.replica_id, cell_id, e)
            self._refuse(stream, ident, parent, f"this replica cannot reach its group ({e})")
            return
        winner = self.order.leads.get((cell_id, attempt), self.replica_id)
        superseded = set(options.get(CellKey.SUPERSEDED) or ())
        first = self.order.first_leads.get(cell_id, self.replica_id)
        if first != self.replica_id and first not in superseded:
            winner = first  # an earlier attempt's executor, which the gateway did not give up
        later = self.order.attempts.get(cell_id, attempt) > attempt  # sent again since
        if later:
            winner = self.order.leads.get((cell_id, self.order.attempts[cell_id]), winner)
        if winner != self.replica_id or cell_id in self.order.completed:
            await self._answer_ran_elsewhere(stream, ident, parent, winner)
            return
        self.log.debug("cell %s (attempt %d): led at entry %d", cell_id, attempt, index)
        await self._wait_for_owed_deltas()
        stage_stamp(cell_id, "owed_deltas_in")
        self._bind_gpus(tuple(options.get(CellKey.DEVICES) or ()))
        self.unpublished = cell_id
        try:
            await super().execute_request(stream, ident, parent)
            stage_stamp(cell_id, "reply_sent")
        finally:
            self.unpublished = None
        group.leadership.after_cell()

    async def do_execute(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """IPython's, then, for a cell this replica leads, its delta committed before the
        reply goes out: an ``ok`` reply means the cell's effects are in the log, so no loss
        of this replica can take them back. A delta that cannot commit within
        `PUBLISH_DEADLINE` turns the reply into a `ErrorName.REPLICA_ISOLATED` refusal: the
        gateway sends the cell again elsewhere, and that LEAD gives this delta up."""
        reply: dict[str, Any] = await super().do_execute(*args, **kwargs)
        cell_id, group = self.unpublished, self.group
        if cell_id is None or group is None:
            return reply
        stage_stamp(cell_id, "ran")
        problem = await self._publish(group, cell_id)
        stage_stamp(cell_id, "delta_committed")
        if problem is not None:
            why = (
                f"this replica ran the cell but cannot reach its group to keep its state: {problem}"
            )
            reply = self._isolated(why)
        return reply

    async def _wait_for_owed_deltas(self) -> None:
        others = self.owing - {self.replica_id}
        if not others:
            return
        try:
            await asyncio.wait_for(self.settled.wait(), OWED_DELTA_WAIT)
        except TimeoutError:
            print(
                f"kernelfleet: the state of the last cell on {', '.join(sorted(others))} never "
                "arrived (that replica was lost); going on from the last committed state",
                file=sys.stderr,
            )
            self.owing.clear()
            self.settled.set()

    def _bind_gpus(self, devices: tuple[str, ...]) -> None:
        """Make `devices` this cell's GPUs; memory left on other devices moves onto them."""
        namespace = self.user_shell.user_ns
        if devices and self.gpus.bound and devices != self.gpus.bound:
            self.gpus.release(namespace)
        if devices:
            self.gpus.reacquire(namespace, devices)
        else:
            self.gpus.bind(())

    async def gpu_release_request(self, stream: Any, ident: Any, parent: dict) -> None:
        """Move this replica's GPU memory to the host: another cell got its devices (control
        thread; the move runs on the main loop, between cells)."""
        loop = self.group.loop if self.group is not None else None
        try:
            if loop is None:
                report = self.gpus.release(self.user_shell.user_ns)
            else:
                call = asyncio.run_coroutine_threadsafe(self._release_gpus(), loop)
                report = await asyncio.wrap_future(call)
            reply: dict[str, Any] = {"status": "ok", **dataclasses.asdict(report)}
        except Exception as e:
            self.log.exception("replica %s could not release its GPUs", self.replica_id)
            reply = {"status": "error", "ename": type(e).__name__, "evalue": str(e)}
        assert self.session is not None
        self.session.send(stream, Reply.RELEASE, reply, parent, ident)

    async def _release_gpus(self) -> MoveReport:
        return self.gpus.release(self.user_shell.user_ns)

    def _reply_aborted(self, stream: Any, ident: Any, parent: dict, why: dict[str, Any]) -> None:
        """Answer a cell this replica yields, saying so under `METADATA_KEY` (the gateway
        drops the reply)."""
        content = {"status": "aborted", "execution_count": None, METADATA_KEY: why}
        assert self.session is not None
        self.session.send(stream, "execute_reply", content, parent, ident)

    async def _answer_ran_elsewhere(
        self, stream: Any, ident: Any, parent: dict, ran_on: str
    ) -> None:
        """Answer a cell sent again that an earlier attempt (on `ran_on`, maybe this very
        replica) ran, as it really ended: once its delta took effect, ``ok`` with a note that
        its output is lost; if no delta comes within `RAN_ELSEWHERE_WAIT`, an error saying
        that whether it completed is unknown. Never run twice, never answered ``aborted``
        (which says the cell did not run)."""
        cell_id = parent["header"]["msg_id"]
        deadline = time.monotonic() + RAN_ELSEWHERE_WAIT
        while cell_id not in self.order.completed and time.monotonic() < deadline:
            arrived = self.delta_admitted
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), deadline - time.monotonic())
        count = self._count_of(cell_id)
        where = "this replica" if ran_on == self.replica_id else f"replica {ran_on}"
        self.log.warning("cell %s already ran on %s; not again", cell_id, where)
        assert self.session is not None
        if cell_id in self.order.completed:
            note = (
                f"kernelfleet: this cell already ran, on {where}, before it was sent again: "
                "its effects are kept in every replica, its output is lost\n"
            )
            self.session.send(
                self.iopub_socket, "stream", {"name": "stderr", "text": note}, parent,
                ident=self._topic("stream"),
            )  # fmt: skip
            content: dict[str, Any] = {
                "status": "ok",
                "execution_count": count,
                "user_expressions": {},
                METADATA_KEY: {CellKey.DUPLICATE_OF.value: ran_on},
            }
        else:
            why = (
                f"this cell was sent again after {where} started it, and its outcome never "
                f"reached the log within {RAN_ELSEWHERE_WAIT:.0f} s: whether it completed "
                "(and its effects are kept) is unknown"
            )
            content = {
                "status": "error",
                "ename": ErrorName.REPLICA_LOST,
                "evalue": why,
                "traceback": [f"{ErrorName.REPLICA_LOST}: {why}"],
                "execution_count": self.user_shell.execution_count,
                METADATA_KEY: {CellKey.DUPLICATE_OF.value: ran_on},
            }
        self.session.send(stream, "execute_reply", content, parent, ident)

    def _count_of(self, cell_id: str) -> int | None:
        """The execution count a completed cell's reply had (its delta holds the shell's
        count after it), or None."""
        after = self.order.completed.get(cell_id)
        return None if after is None else max(after - 1, 0)

    def _refuse(self, stream: Any, ident: Any, parent: dict, why: str) -> None:
        assert self.session is not None
        self.session.send(stream, "execute_reply", self._isolated(why), parent, ident)

    def _isolated(self, why: str) -> dict[str, Any]:
        """The reply content of a cell refused for want of a majority: the gateway never
        relays it, it sends the cell to another replica."""
        return {
            "status": "error",
            "ename": ErrorName.REPLICA_ISOLATED,
            "evalue": why,
            "traceback": [f"{ErrorName.REPLICA_ISOLATED}: {why}"],
            "execution_count": self.user_shell.execution_count,
        }

    async def _publish(self, group: _Group, cell_id: str) -> str | None:
        """Commit what the cell changed; None, or why it could not (then the next cell's
        delta includes it)."""
        delta = group.tracker.diff()
        encoded = encode(delta, group.store)
        entry = StateDelta(
            cell_id=cell_id,
            replica_id=self.replica_id,
            changed=encoded.changed,
            pointers=encoded.pointers,
            deleted=tuple(encoded.deleted),
            execution_count=self.user_shell.execution_count,
            imports=encoded.imports,
            problems=encoded.problems,
            digests=encoded.digests,
        )
        stage_stamp(cell_id, "delta_encoded")
        try:
            index = await group.raft.append_with_retry(entry, time.monotonic() + PUBLISH_DEADLINE)
        except Exception as e:
            self.log.error(
                "replica %s: cell %s's state is unpublished: %s", self.replica_id, cell_id, e
            )
            return f"{type(e).__name__}: {e}"
        self.log.debug("cell %s: its delta committed at entry %d", cell_id, index)
        group.tracker.commit(delta, encoded)
        for line in group.tracker.notices(encoded.problems):  # those early_notices missed
            print(line, file=sys.stderr)
        return None

    def _notice_unsynced(self, result: Any = None) -> None:
        """At the end of a cell (IPython's post_run_cell, before the reply): tell, in its
        output, of the values it bound that will never sync (`NamespaceTracker.early_notices`)."""
        if self.group is not None:
            for line in self.group.tracker.early_notices():
                print(line, file=sys.stderr)

    def _on_commit(self, index: int, entry: Any) -> None:
        """Track who owes a delta; apply another replica's that takes effect (`DeltaOrder`:
        not a second copy, not one given up on), on the main loop, in log order."""
        group = self.group
        if group is None:
            return
        order = self.order
        if isinstance(entry, Proposal) and entry.role is not Role.YIELD:
            if entry.role is Role.LEAD:
                order.lead(index, entry.cell_id, entry.attempt, entry.replica_id)
            else:
                order.settle(entry.cell_id)
            self._update_settled()
            return
        if not isinstance(entry, StateDelta):
            return
        admitted = order.admit(entry.cell_id, entry.replica_id, entry.execution_count)
        self._update_settled()
        if admitted:
            self.delta_admitted.set()
            self.delta_admitted = asyncio.Event()
        if not admitted:
            self.log.warning(
                "replica %s: entry %d, the delta of cell %s by %s, takes no effect: a second "
                "copy of it, or given up on", self.replica_id, index, entry.cell_id,
                entry.replica_id,
            )  # fmt: skip
            return
        if entry.replica_id == self.replica_id:
            return
        self.log.debug("entry %d: applying the delta of cell %s by %s", index, entry.cell_id,
                       entry.replica_id)  # fmt: skip
        encoded = EncodedDelta(
            changed=dict(entry.changed),
            pointers=dict(entry.pointers),
            imports=dict(entry.imports),
            deleted=list(entry.deleted),
            problems=dict(entry.problems),
            digests=dict(entry.digests),
        )
        shell = self.user_shell
        try:
            apply(encoded, shell.user_ns, group.store, tracker=group.tracker)
        except ApplyFailed as e:
            self.log.error("replica %s: entry %d applied in part: %s", self.replica_id, index, e)
        shell.execution_count = entry.execution_count


def drop_secrets(environ: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """Remove `NEVER_INHERITED` from `environ` (this process's, which its subprocesses and the
    notebook's ``os.environ`` get); return the names that were there."""
    found = [name for name in NEVER_INHERITED if name in environ]
    for name in found:
        del environ[name]
    return found


@functools.cache
def log_file() -> Any:
    """The process's stderr as it was at start (the replica's log file), through a descriptor
    of its own: ipykernel captures descriptor 2 itself into the running cell's output, where
    users would read operators' lines."""
    return os.fdopen(os.dup(2), "w", buffering=1)


LOGGED_TO_FILE = ("kernelfleet", "pysyncobj")
"""Loggers whose records go to the replica's log file. pysyncobj's has no handler of its own, so
without this its warnings would reach Python's last-resort handler, which writes to
``sys.stderr``: in a kernel, ipykernel's capture of the running cell's output."""


def log_to_process_stderr(level: str = "") -> None:
    """Send kernelfleet's and pysyncobj's log records to the replica's log file (`log_file`),
    at `level` (a `logging` level name; WARNING when empty)."""
    handler = logging.StreamHandler(log_file())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in LOGGED_TO_FILE:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(level or logging.WARNING)


def main() -> None:
    level = os.environ.get(ReplicaEnv.LOG_LEVEL, "").strip().upper()
    if level not in logging.getLevelNamesMapping():
        level = ""  # an unknown level must not stop a kernel
    log_to_process_stderr(level)
    dropped = drop_secrets()
    if dropped:
        print(f"kernelfleet: removed {', '.join(dropped)} from the kernel's environment",
              file=sys.stderr)  # fmt: skip
    options: dict[str, Any] = {"log_level": level} if level else {}
    IPKernelApp.launch_instance(kernel_class=ReplicatedKernel, **options)


if __name__ == "__main__":
    main()
