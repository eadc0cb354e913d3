"""`KernelLog`: one replica's node in its kernel's Raft group, with an asyncio API.

Threads. pysyncobj runs a tick thread per node: it reads sockets, applies committed entries
and runs the callbacks of replicated calls. This module hands everything to the asyncio loop
given at construction through ``loop.call_soon_threadsafe`` only, and never blocks the tick
thread. Every public method is called on the loop's thread; the log is constructed on that
thread too (pysyncobj stops ticking when the constructing thread ends).

Replicated state. The committed entries (``(index, wire)`` pairs, see `entries`) live in an
`_EntryStore` consumer; its only mutators are the `@replicated` ``append`` and ``prune``.
Everything else on the node is local and is never written to the dump. An entry's *index* is
its position in the log of appends (0, 1, 2, ...), the same on every replica; raft's own no-op
and membership entries are not counted.

Compaction. The leader asks the group to ``prune`` once the list holds
`LogConfig.prune_min_entries` entries and twice as many as after the last prune: every replica
then drops, at the same log position, what `compaction.prune` finds superseded (deltas whose
every name a later delta set again, proposals older than `LogConfig.keep_recent_entries`).
pysyncobj's own log compaction (a full dump every `LogConfig.compaction_min_entries` raft
entries or `LogConfig.compaction_min_time` seconds, then the journal is trimmed) writes that
pruned list, and a replica that joins or falls far behind gets it as a snapshot: it applies the
few entries that rebuild the namespace, not one per cell ever run.

Delivery. ``on_commit(index, entry)`` runs on the loop for every committed entry this process
gets, in index order, exactly once per index per process lifetime: a restarted replica first gets
the entries it recovers from its data dir (journal and full dump), then the ones it catches up
on. Indexes have gaps where a snapshot left pruned entries out. The entry is the decoded
dataclass, or an `UnknownEntry` for a kind this code cannot read. For an ``append`` made by this
process, ``on_commit`` of its index runs before ``append`` returns.

Durability and security. The journal (``raft.journal``) and full dump (``raft.dump``) live in
``data_dir``. The node binds only its own address (a private one, never 0.0.0.0) and all raft
traffic is encrypted and authenticated with ``password``: peers unpickle what they receive, so a
node without the password must never reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException
from pysyncobj.utility import TcpUtility, UtilityException

from kernelfleet.raft import compaction
from kernelfleet.raft.config import LogConfig
from kernelfleet.raft.entries import (
    Entry,
    Proposal,
    Role,
    UnknownEntry,
    Wire,
    decode_or_unknown,
    encode,
)
from kernelfleet.raft.errors import BindFailed, FailReason, LogClosed, NotCommitted, NotReady
from kernelfleet.raft.stale_appends import GuardedTCPTransport

logger = logging.getLogger("kernelfleet.raft.log")

OnCommit = Callable[[int, Entry | UnknownEntry], None]
_RAFT_STATES = {0: "follower", 1: "candidate", 2: "leader"}
_UNSPECIFIED_HOSTS = {"", "0.0.0.0", "::", "[::]", "*"}


class Lifecycle(enum.Enum):
    """A `KernelLog`'s life: OPEN → CLOSING → CLOSED (`close`)."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_TRANSITIONS = {
    Lifecycle.OPEN: {Lifecycle.CLOSING},
    Lifecycle.CLOSING: {Lifecycle.CLOSED},
    Lifecycle.CLOSED: set(),
}


def check_address(address: str) -> str:
    """Validate ``host:port`` with a concrete host (never the wildcard) and a port 1-65535."""
    host, sep, port = address.rpartition(":")
    if not sep or host in _UNSPECIFIED_HOSTS or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"raft address must be host:port on a concrete address, not {address!r}")
    return address


class _EntryStore(SyncObjConsumer):
    """The replicated state: committed ``(index, wire)`` pairs in log order, less what
    ``prune`` dropped (never the newest, so the last index is always there).

    ``append`` and ``prune`` run on the tick thread of every replica when they commit; they are
    small and deterministic. ``on_applied`` (local, not replicated) is called after each apply
    so the log can hand new entries to the loop; ``on_pruned`` after each prune.
    """

    def __init__(self, on_applied: Callable[[], None], on_pruned: Callable[[], None]) -> None:
        # Attributes set before SyncObjConsumer.__init__ are local; those set after are dumped.
        self._on_applied = on_applied
        self._on_pruned = on_pruned
        self.kept = 0
        """How many entries the last prune here kept (the next one waits for twice as many)."""
        super().__init__()
        self.entries: list[tuple[int, Wire]] = []

    @property
    def next_index(self) -> int:
        """The index the next entry gets."""
        return self.entries[-1][0] + 1 if self.entries else 0

    @replicated
    def append(self, wire: Wire) -> int:
        index = self.next_index
        self.entries.append((index, wire))
        self._on_applied()
        return index

    @replicated
    def prune(self, keep_recent: int) -> int:
        """Drop the superseded entries (`compaction.prune`); return how many went."""
        before = len(self.entries)
        self.entries = compaction.prune(self.entries, keep_recent)
        self.kept = len(self.entries)
        self._on_pruned()
        return before - self.kept


class KernelLog(SyncObj):
    """A kernel replica's replicated log of small typed entries (see the module docstring).

    `self_address` and every peer are ``host:port``; `peers` lists the group's current members
    (the node's own address may be among them). `password` is required. `loop` is the loop that
    receives ``on_commit`` calls and on which every method is awaited. Construction binds the
    raft port (`BindFailed` if it cannot) and returns at once; `wait_ready` waits for a leader.
    """

    # pysyncobj's TCP transport, minus a follower's truncation of entries it acknowledged.
    TRANSPORT = GuardedTCPTransport

    def __init__(
        self,
        self_address: str,
        peers: Iterable[str],
        *,
        password: str,
        data_dir: str | Path,
        loop: asyncio.AbstractEventLoop,
        on_commit: OnCommit,
        config: LogConfig | None = None,
    ) -> None:
        if not isinstance(password, str) or not password:
            raise ValueError("a raft group needs a non-empty password (it encrypts all traffic)")
        check_address(self_address)
        others = sorted({check_address(peer) for peer in peers} - {self_address})
        data_path = Path(data_dir)
        data_path.mkdir(parents=True, exist_ok=True)

        # Every attribute of ours exists before SyncObj.__init__: pysyncobj dumps only the
        # attributes added after it, and the replicated state lives in self._store anyway.
        self._config = config or LogConfig()
        self._address = self_address
        self._password = password
        self._loop = loop
        self._on_commit = on_commit
        self._lifecycle = Lifecycle.OPEN
        self._scheduled = 0  # tick thread: indexes below it were handed to the loop
        self._ready_count: int | None = None  # tick thread, once: next index when ready
        self._loop_gone = False  # tick thread: the loop was closed under us
        self._pruning = False  # tick thread: a prune this node asked for is in flight
        self._prunes = 0  # tick thread: prunes applied here
        self._applied = 0  # loop thread: the index after the last one on_commit saw
        self._delivered_count = 0  # loop thread: on_commit calls
        self._delivered: list[tuple[int, Entry | UnknownEntry]] = []  # loop: still retained
        self._pending: set[asyncio.Future[Any]] = set()  # loop thread: calls in flight
        self._membership_lock = asyncio.Lock()
        self._store = _EntryStore(self._flush, self._pruned)

        conf = self._config.syncobj_conf(
            address=self_address,
            password=password,
            data_dir=data_path,
            on_ready=self._on_ready,
            on_state_changed=self._on_state_changed,
        )
        super().__init__(
            self_address, others, conf=conf, consumers=[self._store], transportClass=self.TRANSPORT
        )
        try:
            self.waitBinded()
        except SyncObjException:
            if self.tick_thread_alive():  # bind_attempts > 1: it is still retrying
                self.destroy_synchronous()
            else:
                self._doDestroy()
            self._close_wakeup_pipe()
            self._lifecycle = Lifecycle.CLOSED
            raise BindFailed(f"cannot bind raft address {self_address}") from None
        self.addOnTickCallback(self._flush)
        self.addOnTickCallback(self._maybe_prune)
        logger.info(
            "raft node %s started with peers %s, data in %s", self_address, others, data_path
        )

    # -- tick thread ------------------------------------------------------------------------

    def _flush(self) -> None:
        """Hand entries applied since the last call to the loop, in order (tick thread).

        Runs after each apply and on every tick: a full dump loaded at start or sent by the
        leader replaces the whole list without calling ``append``.
        """
        store = self._store
        entries, start, end = store.entries, self._scheduled, store.next_index
        if end <= start:
            if end < start:
                logger.warning("replicated list went back from index %d to %d", start, end)
            return
        first = len(entries)
        while first > 0 and entries[first - 1][0] >= start:
            first -= 1
        batch = [(index, decode_or_unknown(wire)) for index, wire in entries[first:]]
        self._scheduled = end
        self._to_loop(self._deliver, batch)

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> None:
        if self._loop_gone:
            return
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            self._loop_gone = True
            logger.warning("event loop closed; raft node %s stops delivering", self._address)

    def _maybe_prune(self) -> None:
        """On the leader, ask the group to prune once the list has grown enough (tick thread)."""
        store, config = self._store, self._config
        if self._pruning or len(store.entries) < max(config.prune_min_entries, 2 * store.kept):
            return
        if not self._isLeader():
            return
        self._pruning = True

        def done(result: Any, code: object) -> None:  # tick thread
            self._pruning = False
            if FailReason.from_code(code) is not FailReason.SUCCESS:
                logger.debug("prune not committed (%s)", FailReason.from_code(code))

        self._store.prune(config.keep_recent_entries, callback=done)

    def _pruned(self) -> None:
        """After a prune applied here (tick thread): the loop forgets what went."""
        self._prunes += 1
        kept = frozenset(index for index, _ in self._store.entries)
        self._to_loop(self._forget_pruned, kept, self._store.next_index)

    def _on_ready(self) -> None:
        """pysyncobj's onReady (tick thread): this node has applied the leader's commit index."""
        self._ready_count = self._store.next_index

    def _on_state_changed(self, old: int, new: int) -> None:
        logger.info(
            "raft node %s: %s -> %s (term %d)",
            self._address,
            _RAFT_STATES.get(old, old),
            _RAFT_STATES.get(new, new),
            self.raftCurrentTerm,
        )

    # -- loop thread ------------------------------------------------------------------------

    def _deliver(self, batch: list[tuple[int, Entry | UnknownEntry]]) -> None:
        """Record and announce committed entries, in index order (loop thread)."""
        if self._lifecycle is Lifecycle.CLOSED:
            return
        for index, entry in batch:
            if index < self._applied:
                logger.error("delivery went back: got index %d after %d", index, self._applied)
                continue
            self._delivered.append((index, entry))
            self._applied = index + 1
            self._delivered_count += 1
            if isinstance(entry, UnknownEntry):
                logger.warning("entry %d cannot be decoded: %s", index, entry.error)
            try:
                self._on_commit(index, entry)
            except Exception:
                logger.exception("on_commit raised for entry %d", index)

    def _forget_pruned(self, kept: frozenset[int], below: int) -> None:
        """Drop from `_delivered` what a prune dropped (loop thread)."""
        self._delivered = [(i, e) for i, e in self._delivered if i in kept or i >= below]

    def _settle(self, future: asyncio.Future[Any], result: Any, code: object, what: str) -> None:
        if future.done():
            return  # timed out or closed meanwhile
        reason = FailReason.from_code(code)
        if reason is FailReason.SUCCESS:
            future.set_result(result)
        else:
            future.set_exception(NotCommitted(reason, what))

    async def _call(self, submit: Callable[[Any], None], timeout: float, what: str) -> Any:
        """Submit a replicated call with a callback; await its outcome on the loop."""
        if self._lifecycle is not Lifecycle.OPEN:
            raise LogClosed(f"raft log {self._address} is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            raise RuntimeError("KernelLog methods must be awaited on the loop given to it")
        future: asyncio.Future[Any] = loop.create_future()

        def on_result(result: Any, code: object) -> None:  # tick thread
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._settle, future, result, code, what)

        self._pending.add(future)
        try:
            submit(on_result)
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise NotCommitted(FailReason.TIMEOUT, what) from None
        finally:
            self._pending.discard(future)

    # -- public API (loop thread) -----------------------------------------------------------

    @property
    def address(self) -> str:
        return str(self._address)

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def leader(self) -> str | None:
        """The leader this node last heard of (may be stale for up to an election timeout)."""
        node = self._getLeader()
        return None if node is None else str(getattr(node, "address", node.id))

    @property
    def is_leader(self) -> bool:
        return bool(self._isLeader())

    @property
    def term(self) -> int:
        return int(self.raftCurrentTerm)

    @property
    def members(self) -> tuple[str, ...]:
        """The group as this node sees it, itself included; a membership change counts from
        when this node has it in its log (before it commits), as in pysyncobj."""
        others = {str(getattr(node, "address", node.id)) for node in self.otherNodes}
        return tuple(sorted(others | {self._address}))

    @property
    def applied_count(self) -> int:
        """The index after the last entry ``on_commit`` has seen (the next index to arrive);
        with no pruning, how many entries it saw."""
        return self._applied

    @property
    def delivered_count(self) -> int:
        """How many entries ``on_commit`` has seen: below `applied_count` when this node
        caught up from a pruned snapshot."""
        return self._delivered_count

    @property
    def retained_count(self) -> int:
        """How many entries the replicated list holds now (what a snapshot would carry)."""
        return len(self._store.entries)

    @property
    def prune_count(self) -> int:
        """How many prunes this node applied."""
        return self._prunes

    @property
    def is_ready(self) -> bool:
        """A leader is known and ``on_commit`` has seen everything committed when this node
        first caught up with the leader."""
        ready_count = self._ready_count
        return (
            ready_count is not None
            and self._applied >= ready_count
            and self._getLeader() is not None
        )

    @property
    def lifecycle(self) -> Lifecycle:
        return self._lifecycle

    def entries_from(self, index: int = 0) -> list[Entry | UnknownEntry]:
        """Committed entries of index `index` and above that ``on_commit`` has already seen
        and that no prune dropped since."""
        if index < 0:
            raise ValueError(f"index must be >= 0, not {index}")
        return [entry for i, entry in self._delivered if i >= index]

    def live_keys(self) -> set[str]:
        """The object-store keys the replicated state still points to, superseded values left
        out (`compaction.live_keys`): what the object-store collector must keep."""
        return compaction.live_keys(list(self._store.entries))

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Return once `is_ready`; `NotReady` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.is_ready:
            if self._lifecycle is not Lifecycle.OPEN:
                raise LogClosed(f"raft log {self._address} is closed")
            if time.monotonic() >= deadline:
                raise NotReady(
                    f"raft node {self._address} not ready after {timeout:.1f} s "
                    f"(leader: {self.leader}, applied {len(self._delivered)})"
                )
            await asyncio.sleep(0.01)

    async def append(self, entry: Entry, timeout: float = 5.0) -> int:
        """Append `entry`; return its index once committed and applied here.

        `EntryTooLarge` (before anything reaches pysyncobj) if it is over the size limit;
        `NotCommitted` with a `FailReason` otherwise: ``MISSING_LEADER`` during an election,
        ``LEADER_CHANGED`` if the leader died with the call in flight, ``TIMEOUT`` after
        `timeout` s. After a failure the entry may still commit (`FailReason.may_have_committed`).
        """
        wire = encode(entry, self._config.max_entry_bytes)
        index = await self._call(
            lambda callback: self._store.append(wire, callback=callback), timeout, "append"
        )
        return int(index)

    async def append_with_retry(
        self, entry: Entry, deadline: float, *, attempt_timeout: float = 1.0
    ) -> int:
        """`append`, retried on retryable failures until `deadline` (a ``time.monotonic()``
        value, the clock of ``loop.time()``); raises the last failure after it.

        A retry after an outcome that `may_have_committed` can log the entry twice: consumers
        keep the first per `Entry.key` (see `entries.first_per_key`).
        """
        encode(entry, self._config.max_entry_bytes)  # refuse oversized entries at once
        delay = 0.02
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NotCommitted(FailReason.TIMEOUT, "append")
            try:
                return await self.append(entry, timeout=min(attempt_timeout, remaining))
            except NotCommitted as error:
                if not error.retryable or deadline - time.monotonic() <= delay:
                    raise
                logger.debug("append failed (%s); retrying in %.2f s", error.reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def take_leadership(self, timeout: float = 1.0) -> bool:
        """Ask the group's leader to hand its leadership to this node; True if this node leads
        already or the leader agreed, False if no leader is known, or it refused (this node's
        log is not yet complete: try again after the next commit), or did not answer within
        `timeout` s.

        The leader agreeing is Raft's leadership transfer (pysyncobj's ``transfer`` command,
        sent over the encrypted raft port with the group's password): it tells this node to
        start an election at once, which it wins because its log holds every entry the leader
        has. Nothing committed changes; calls in flight anywhere in the group may fail with
        ``LEADER_CHANGED`` or ``MISSING_LEADER`` meanwhile (retryable). Whether and when this
        node won is `is_leader`'s to tell (one election, usually within a few ticks).
        """
        if self.is_leader:
            return True
        leader = self.leader
        if leader is None or self._lifecycle is not Lifecycle.OPEN:
            return False
        command = ["transfer", self._address]

        def ask() -> object:  # a thread: the utility polls its own socket until answered
            return TcpUtility(self._password, timeout).executeCommand(leader, command)

        try:
            answer = await asyncio.to_thread(ask)
        except UtilityException as error:
            logger.debug("raft node %s: leader %s did not answer: %s", self._address, leader, error)
            return False
        agreed = isinstance(answer, str) and answer.startswith("SUCCESS")
        logger.info("raft node %s: asked %s for the leadership: %s", self._address, leader, answer)
        return agreed

    async def add_member(self, address: str, timeout: float = 5.0) -> None:
        """Add `address` to the group (no-op if this node already counts it a member).

        Start the new replica after this returns, with the group's members as its peers: it
        then catches up from the leader. One change at a time: a concurrent change elsewhere
        fails with ``REQUEST_DENIED``.
        """
        check_address(address)
        async with self._membership_lock:
            if address in self.members and await self._membership_holds(address, True, timeout):
                return
            await self._call(
                lambda callback: self.addNodeToCluster(address, callback=callback),
                timeout,
                f"add member {address}",
            )

    async def remove_member(self, address: str, timeout: float = 5.0) -> None:
        """Remove `address` (e.g. a dead replica) from the group; no-op if not a member.

        A node cannot remove itself: ask another member."""
        check_address(address)
        if address == self._address:
            raise ValueError("a raft node cannot remove itself; ask another member")
        async with self._membership_lock:
            if address not in self.members and await self._membership_holds(
                address, False, timeout
            ):
                return
            await self._call(
                lambda callback: self.removeNodeFromCluster(address, callback=callback),
                timeout,
                f"remove member {address}",
            )

    async def _membership_holds(self, address: str, member: bool, timeout: float) -> bool:
        """Whether `address` is (`member`) or is not a member once what this node's log holds
        is committed. pysyncobj applies a membership change as soon as it is in the log: an
        earlier attempt of the same change, not yet committed, is undone if a leader without
        it takes over, and a retry that took it for done would leave the group without it (a
        replacement started with peers that never counted it: no majority once one more
        replica went). Committing an entry of its own commits everything before it."""
        barrier = Proposal(cell_id=f"membership {address}", replica_id=self._address,
                           role=Role.YIELD)  # fmt: skip
        await self.append(barrier, timeout=timeout)
        return (address in self.members) is member

    async def close(self, timeout: float = 5.0) -> None:
        """Stop the node: calls in flight fail with `LogClosed`, the tick thread ends, the port
        and journal are released. Idempotent. ``on_commit`` is not called after this returns."""
        if self._lifecycle is not Lifecycle.OPEN:
            return
        self._move(Lifecycle.CLOSING)
        for future in list(self._pending):
            if not future.done():
                future.set_exception(LogClosed(f"raft log {self._address} closed"))
        self.removeOnTickCallback(self._flush)
        self.removeOnTickCallback(self._maybe_prune)
        if self.tick_thread_alive():
            self.destroy()
            deadline = time.monotonic() + timeout
            while self.tick_thread_alive():
                if time.monotonic() >= deadline:
                    logger.warning("raft node %s: tick thread still running", self._address)
                    break
                await asyncio.sleep(0.01)
        else:
            self._doDestroy()
        if not self.tick_thread_alive():
            self._close_wakeup_pipe()
        self._move(Lifecycle.CLOSED)
        logger.info("raft node %s closed", self._address)

    def _close_wakeup_pipe(self) -> None:
        """Close the pipe pysyncobj wakes its tick thread with (its destroy leaks it)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name, None)
            if isinstance(fd, int):
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(notifier, name, None)

    def _move(self, to: Lifecycle) -> None:
        if to not in _TRANSITIONS[self._lifecycle]:
            raise RuntimeError(f"raft log cannot go from {self._lifecycle.name} to {to.name}")
        self._lifecycle = to
