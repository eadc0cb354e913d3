"""Deleting a live kernel's superseded objects: the replica that leads its Raft group does it.

A value too large for the log goes to the kernel's object-store folder, and its delta points to
it by key. When a later cell binds that name again (or deletes it), the old object is garbage
once every replica has applied the newer delta: nobody will load it again, and a replica that
joins later gets a snapshot without the superseded delta (`kernelfleet.raft.compaction`).

Who: the replica that is the group's Raft leader. It runs as the kernel's own user (the folder
is that user's, mode 0700), knows which keys the replicated state still points to
(`KernelLog.live_keys`) and how far each member's log is (``match_idx``). The others do nothing.

When: an object is deleted once all of these hold:

- no live label points to it (`KernelLog.live_keys`);
- it has been so for `grace` seconds, as seen by this leader (a new leader starts counting
  afresh), and its file is older than `grace` (a replica writes an object before the delta
  pointing to it commits: it is unreferenced in between);
- every member of the group had, in its log, the commit index of the moment it was first found
  unreferenced: the newer delta reached every replica (which applies it on its next tick).

`grace` comes from ``KERNELFLEET_OBJECTS_GRACE`` (seconds, default
`kernels.objectstore.DEFAULT_GRACE`), which the host agent passes on to its replicas. The
objects of a kernel that is shut down are the gateway's to remove, all at once
(``kernelfleet.gateway.objects_gc``).

Threads: `ObjectCollector.run` is a task on the replica's main loop (where the log's methods
belong); listing and deleting files run in a worker thread, as the store's contract says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kernelfleet.kernels.objectstore import (
    LocalDirectoryStore,
    ObjectStore,
    grace_from_env,
)
from kernelfleet.raft import KernelLog

log = logging.getLogger("kernelfleet.statesync.gc")


@dataclass
class _Candidate:
    since: float
    """When this leader first found it unreferenced (``time.monotonic()``)."""
    commit_index: int
    """The group's commit index then: every member must have reached it."""


@dataclass
class ObjectCollector:
    """Deletes the superseded objects of one kernel's store while its replica leads the group
    (see the module docstring). `clock` is ``time.monotonic``."""

    raft: KernelLog
    store: ObjectStore
    grace: float = field(default_factory=grace_from_env)
    interval: float = 0.0
    """Seconds between rounds; 0: a quarter of `grace`, between 1 and 30 s."""
    clock: Callable[[], float] = time.monotonic
    deleted: int = 0
    _candidates: dict[str, _Candidate] = field(default_factory=dict)

    async def run(self) -> None:
        """Collect every `interval` seconds until cancelled."""
        pause = self.interval or min(30.0, max(1.0, self.grace / 4))
        while True:
            await asyncio.sleep(pause)
            try:
                await self.collect()
            except Exception:
                log.exception("object collection failed; trying again in %.0f s", pause)

    async def collect(self) -> list[str]:
        """One round: forget candidates while not the leader; otherwise delete what is due.
        Returns the deleted keys."""
        if not self.raft.is_leader:
            self._candidates.clear()
            return []
        live = self.raft.live_keys()
        present = await asyncio.to_thread(lambda: set(self.store.keys()))
        now, commit_index = self.clock(), int(self.raft.raftCommitIndex)
        for key in list(self._candidates):
            if key in live or key not in present:
                del self._candidates[key]
        for key in present - live:
            self._candidates.setdefault(key, _Candidate(now, commit_index))
        reached = self._members_reached()
        due = [
            key
            for key, found in self._candidates.items()
            if now - found.since >= self.grace and reached(found.commit_index)
        ]
        if not due:
            return []
        deleted = await asyncio.to_thread(self._delete_old, due)
        for key in deleted:
            self._candidates.pop(key, None)
        self.deleted += len(deleted)
        if deleted:
            log.info("deleted %d superseded object(s) of this kernel", len(deleted))
        return deleted

    def _members_reached(self) -> Callable[[int], bool]:
        """A test: have all other members' logs reached this commit index (leader's view)?"""
        try:
            status = self.raft.getStatus()
        except RuntimeError:  # the tick thread changed a dict under us: next round
            return lambda index: False
        matched = [v for k, v in status.items() if k.startswith("match_idx_server_")]
        lowest = min(matched, default=None)
        if lowest is None:
            return lambda index: True  # a group of one
        return lambda index: lowest >= index

    def _delete_old(self, keys: list[str]) -> list[str]:
        """Delete the objects whose file is older than `grace` (worker thread)."""
        deleted = []
        for key in keys:
            if isinstance(self.store, LocalDirectoryStore):
                age = self.store.age(key)
                if age is not None and age < self.grace:
                    continue  # written or reused lately: a new entry may point to it
            self.store.delete(key)
            deleted.append(key)
        if isinstance(self.store, LocalDirectoryStore):
            self.store.sweep_partials(max(self.grace, 3600.0))
        return deleted


def start_collector(raft: KernelLog, store: ObjectStore) -> asyncio.Task[None]:
    """Start collecting `store`'s superseded objects on the running loop (the replica calls it
    once it joined its group); the task ends when cancelled or when the loop stops."""
    collector = ObjectCollector(raft, store)
    return asyncio.ensure_future(collector.run())
