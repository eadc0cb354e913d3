"""Tunables of a kernel's Raft group, checked once, and their pysyncobj translation.

The defaults are tuned for cell latency on a LAN: no append batching (batching
waits for a 0.1 s tick per commit), elections after 0.2-0.5 s of silence, heartbeats every
50 ms, reconnects to a lost peer every 0.5 s (pysyncobj's 5 s default stalls a restarted
replica's catch-up).

Log compaction (see `kernelfleet.raft.log`): the group prunes superseded entries and pysyncobj
writes the pruned list as a full dump, so its journal and in-memory log stay short and a new
replica catches up from that snapshot. Those four limits may also come from the environment
(``KERNELFLEET_RAFT_COMPACTION_MIN_ENTRIES``, ``KERNELFLEET_RAFT_COMPACTION_MIN_TIME``,
``KERNELFLEET_RAFT_PRUNE_MIN_ENTRIES``, ``KERNELFLEET_RAFT_KEEP_RECENT_ENTRIES``), which a host
agent passes on to its replicas: read when a `LogConfig` is made without them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pysyncobj import SyncObjConf

from kernelfleet.raft.entries import MAX_ENTRY_BYTES

JOURNAL_FILE = "raft.journal"
DUMP_FILE = "raft.dump"


def _from_env(name: str, default: float, kind: type = int) -> Callable[[], Any]:
    """A default factory: $`name` as `kind` if set and valid, else `default`."""

    def read() -> Any:
        raw = os.environ.get(name, "")
        try:
            return kind(raw) if raw else kind(default)
        except ValueError:
            return kind(default)

    return read


@dataclass(frozen=True)
class LogConfig:
    """Timing and size limits of one `KernelLog`. All durations in seconds."""

    min_timeout: float = 0.2
    """A follower that hears nothing from the leader for a random time in
    [min_timeout, max_timeout] starts an election."""
    max_timeout: float = 0.5
    heartbeat: float = 0.05
    """Leader heartbeat period; must be under min_timeout / 3."""
    tick: float = 0.05
    """Longest wait of pysyncobj's tick thread for socket events (new commands wake it)."""
    connection_timeout: float = 3.5
    """A connection silent this long is considered dead (>= max_timeout)."""
    connection_retry: float = 0.5
    """Interval between reconnect attempts to a lost peer."""
    leader_fallback: float = 2.0
    """A leader that hears from no majority for this long steps down, so that appends on its
    side of a partition fail instead of hanging."""
    max_entry_bytes: int = MAX_ENTRY_BYTES
    """Largest serialized entry `KernelLog.append` accepts."""
    compaction_min_entries: int = field(
        default_factory=_from_env("KERNELFLEET_RAFT_COMPACTION_MIN_ENTRIES", 1000)
    )
    """Write a full dump (and trim the journal) after this many raft entries ... (was 5000:
    entries are kept in memory until then, up to 256 KiB each, and a restarted replica replays
    the journal; the pruned dump is small, so dumping more often costs little)."""
    compaction_min_time: float = field(
        default_factory=_from_env("KERNELFLEET_RAFT_COMPACTION_MIN_TIME", 120.0, float)
    )
    """... or this long after the previous dump (was 300 s: a replica that joins gets the
    dump plus the journal since, so a shorter interval means less to replay)."""
    prune_min_entries: int = field(
        default_factory=_from_env("KERNELFLEET_RAFT_PRUNE_MIN_ENTRIES", 1000)
    )
    """The leader asks the group to drop superseded entries once the replicated list holds
    this many, and twice as many as the last prune kept (so pruning costs O(1) per entry)."""
    keep_recent_entries: int = field(
        default_factory=_from_env("KERNELFLEET_RAFT_KEEP_RECENT_ENTRIES", 5000)
    )
    """A prune keeps every entry among this many newest ones: recent proposals let a replica
    refuse a cell another one already ran (a resent cell arrives within seconds), and a
    replica that joins from the pruned list decides about a late delta as the others do
    (`DeltaOrder`; such a delta commits within the replica's publish deadline, 10 s: about
    1,000 entries for a kernel running 25 tiny cells a second)."""
    use_fork: bool = True
    """Write dumps in a forked child so the tick thread never stalls on a large dump."""
    commands_wait_leader: bool = False
    """False: an append while no leader is known fails at once with MISSING_LEADER (retry
    with `append_with_retry`); True: it waits in pysyncobj's queue, possibly beyond its timeout."""
    bind_attempts: int = 1
    """Attempts to bind the raft port (0.2 s apart) before the constructor gives up."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.heartbeat * 3 < self.min_timeout:
            problems.append("heartbeat must be > 0 and under min_timeout / 3")
        if not self.max_timeout > self.min_timeout:
            problems.append("max_timeout must exceed min_timeout")
        if not self.connection_timeout >= self.max_timeout:
            problems.append("connection_timeout must be >= max_timeout")
        if not self.leader_fallback > self.heartbeat:
            problems.append("leader_fallback must exceed heartbeat")
        if self.tick <= 0 or self.connection_retry < 0:
            problems.append("tick must be > 0 and connection_retry >= 0")
        if self.max_entry_bytes < 1024:
            problems.append("max_entry_bytes must be at least 1024")
        if self.compaction_min_entries < 2 or self.compaction_min_time <= 0:
            problems.append("compaction_min_entries must be >= 2 and compaction_min_time > 0")
        if self.prune_min_entries < 2 or self.keep_recent_entries < 1:
            problems.append("prune_min_entries must be >= 2 and keep_recent_entries >= 1")
        if self.bind_attempts < 1:
            problems.append("bind_attempts must be >= 1")
        if problems:
            raise ValueError("invalid LogConfig: " + "; ".join(problems))

    def syncobj_conf(
        self,
        *,
        address: str,
        password: str,
        data_dir: Path,
        on_ready: Callable[[], None],
        on_state_changed: Callable[[int, int], None],
    ) -> SyncObjConf:
        """The pysyncobj configuration for a node bound to `address` (never 0.0.0.0)."""
        conf = SyncObjConf(
            password=password,
            bindAddress=address,
            appendEntriesUseBatch=False,
            dynamicMembershipChange=True,
            raftMinTimeout=self.min_timeout,
            raftMaxTimeout=self.max_timeout,
            appendEntriesPeriod=self.heartbeat,
            autoTickPeriod=self.tick,
            connectionTimeout=self.connection_timeout,
            connectionRetryTime=self.connection_retry,
            leaderFallbackTimeout=self.leader_fallback,
            logCompactionMinEntries=self.compaction_min_entries,
            logCompactionMinTime=self.compaction_min_time,
            useFork=self.use_fork,
            commandsWaitLeader=self.commands_wait_leader,
            journalFile=str(data_dir / JOURNAL_FILE),
            fullDumpFile=str(data_dir / DUMP_FILE),
            bindRetryTime=0.2,
            maxBindRetries=self.bind_attempts,
            onReady=on_ready,
            onStateChanged=on_state_changed,
        )
        conf.validate()
        return conf
