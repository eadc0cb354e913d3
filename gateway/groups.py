"""Keeping replicated kernels whole: repair after a loss, migration, and draining a host.

A replicated kernel's replicas form a Raft group. `GroupKeeper` changes its membership while
the kernel runs:

- `replica_died`: a replica is gone (its process exited, or its host was lost). If it was the
  kernel's last, the kernel is dead; otherwise, for a replicated kernel, a repair replaces it
  in the background (`_replace`) so the group has its size back. Until it has, the kernel is
  *degraded* (`KernelRecord.degraded`: since when, and why, naming the lost replica, its host,
  the cause, and what the replacement waits for), with a ``kernel-degraded`` event each time
  the reason changes and ``kernel-repaired`` once whole. A replacement that cannot happen now
  is tried again on a timer, and at once when a host registers or comes back;
- `migrate` / `move_replica`: add-first, state kept: a new replica joins and catches up, the
  old one stops and leaves (the policy's `Migrate`, or an admin's request);
- `drain_host`: every replica off a host, so it can be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import zmq.asyncio

from kernelfleet.errors import Conflict, FleetError, NotFound
from kernelfleet.gateway.admission import Admission
from kernelfleet.gateway.background import Background
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.hosts import HostRegistry, HostState
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.launcher import CapacityListener, ReplicaLauncher
from kernelfleet.gateway.links import KernelLinker
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import (
    KernelRecord,
    ReplicaRecord,
    ReplicaState,
    ReplicationSettings,
)
from kernelfleet.gateway.replication import Member, change_members, join_group, send_request
from kernelfleet.protocol import ForgetContent, Request

log = logging.getLogger("kernelfleet.gateway.kernels")

REPAIR_RETRY = 2.0
"""Seconds before a replacement that failed is tried again (then twice as long each time)."""
REPAIR_RETRY_MAX = 30.0
"""The longest wait between two tries at replacing a lost replica."""


class GroupKeeper:
    """Repairs, migrates and drains; see the module docstring."""

    def __init__(
        self,
        kernels: KernelTable,
        hosts: HostRegistry,
        admission: Admission,
        launcher: ReplicaLauncher,
        linker: KernelLinker,
        capacity: CapacityListener,
        context: zmq.asyncio.Context,
        replication: ReplicationSettings,
        launch_timeout: float,
        metrics: FleetMetrics,
        background: Background,
        events: EventBus | None = None,
    ) -> None:
        self._events = events or EventBus()
        self._kernels = kernels
        self._hosts = hosts
        self._admission = admission
        self._launcher = launcher
        self._linker = linker
        self._capacity = capacity
        self._context = context
        self._replication = replication
        self._launch_timeout = launch_timeout
        self._metrics = metrics
        self._background = background
        self._hosts_changed = asyncio.Event()
        """Set (and replaced by a fresh one) when a host registers or comes back."""
        hosts.watch(self.hosts_changed)

    def hosts_changed(self) -> None:
        """A host registered or came back: waiting repairs try again now."""
        changed, self._hosts_changed = self._hosts_changed, asyncio.Event()
        changed.set()

    # ---- losses ----------------------------------------------------------------------------

    def replica_died(self, kernel: KernelRecord, replica: ReplicaRecord, why: str) -> None:
        """`replica` (already ``dead``) is gone, for `why`: its GPUs go back; a kernel left
        with no replica is dead (its running cell ends, later ones fail at once); a replicated
        one is repaired in the background."""
        self.replicas_died([(kernel, replica, why)])

    def replicas_died(self, deaths: list[tuple[KernelRecord, ReplicaRecord, str]]) -> None:
        """Each replica of `deaths` died as `replica_died` says, the kernels written to the
        store once for all of them: a lost host's replicas die together, and a write per
        replica (the whole table, synced to disk) held the event loop for seconds when a host
        with 40 replicas was lost."""
        for kernel, replica, why in deaths:
            log.error(
                "kernel %s: replica %s on %s died: %s", kernel.id, replica.id, replica.host_id, why
            )
            self._launcher.unsubscribe(kernel, replica)
        if deaths:
            self._kernels.persist()
        for kernel, replica, why in deaths:
            self._after_death(kernel, replica, why)

    def _after_death(self, kernel: KernelRecord, replica: ReplicaRecord, why: str) -> None:
        self._events.publish(
            EventType.REPLICA_LOST,
            {"replica_id": replica.id, "why": why},
            kernel_id=kernel.id,
            host_id=replica.host_id,
        )
        if kernel.dead:
            kernel.execution_state = "dead"
            if kernel.link is not None:  # its running cell ends, and later ones fail at once
                kernel.link.remove_replica(replica.id, f"the kernel's last replica died: {why}")
            self._linker.announce(kernel, "dead")
        elif kernel.replicated:
            self._degrade(kernel, f"{_lost(replica, why)}; it is being replaced")
            self._background.run(self._repair(kernel, replica, why))

    async def _repair(self, kernel: KernelRecord, lost: ReplicaRecord, why: str) -> None:
        """Fail over if `lost` ran the kernel, then replace it so the group has its size back.

        A replacement that cannot be placed or started now is tried again, `REPAIR_RETRY`
        seconds later at first, then less often (up to `REPAIR_RETRY_MAX`), and at once when a
        host registers or comes back (`hosts_changed`), for as long as the kernel lives and
        still misses the replica. Between tries the kernel's lifecycle lock is free (it may be
        shut down or restarted). However it ends, the kernel is no longer degraded if it has
        every replica it wants (`_check_whole`)."""
        try:
            await self._repair_until_done(kernel, lost, why)
        finally:
            self._check_whole(kernel)

    async def _repair_until_done(self, kernel: KernelRecord, lost: ReplicaRecord, why: str) -> None:
        async with self._lifecycle_if_current(kernel, lost) as current:
            if not current:
                return  # shut down or restarted meanwhile
            kernel.lost_replicas.append(lost.id)
            if kernel.link is not None:
                kernel.link.remove_replica(lost.id, f"the replica running it ({lost.id}) was lost")
            await self._forget(kernel, lost)
        delay, said = REPAIR_RETRY, ""
        while True:
            changed = self._hosts_changed
            async with self._lifecycle_if_current(kernel, lost) as current:
                if not current or kernel.dead:
                    return
                try:
                    new = await self._replace(kernel, lost)
                except FleetError as e:
                    if e.message != said:  # the same cause again: said already
                        live = len(kernel.live_replicas())
                        log.error(
                            "kernel %s: runs on %d replica(s); replacing %s failed, tried again "
                            "while it lasts: %s", kernel.id, live, lost.id, e,
                        )  # fmt: skip
                        said = e.message
                        self._degrade(kernel, f"{_lost(lost, why)}; a replacement waits: {e}")
                else:
                    self._moved(EventType.REPLICA_REPLACED, kernel, lost, new)
                    return
                finally:
                    self._kernels.persist()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), delay)
            if changed.is_set():
                log.info(
                    "kernel %s: a host registered or came back: trying again to replace %s",
                    kernel.id, lost.id,
                )  # fmt: skip
            delay = min(delay * 2, REPAIR_RETRY_MAX)

    def _degrade(self, kernel: KernelRecord, reason: str) -> None:
        """`kernel` misses a replica, for `reason`: shown in its model, and an event."""
        if kernel.degraded_reason == reason:
            return
        kernel.degrade(reason, time.time())
        self._count_degraded()
        degraded = kernel.degraded() or {}
        self._events.publish(
            EventType.KERNEL_DEGRADED,
            {key: degraded[key] for key in ("reason", "live_replicas", "wanted_replicas")},
            kernel_id=kernel.id,
        )

    def _count_degraded(self) -> None:
        count = sum(1 for kernel in self._kernels.all() if kernel.degraded_since is not None)
        self._metrics.degraded_kernels.set(count)

    def _check_whole(self, kernel: KernelRecord) -> None:
        """No longer degraded if `kernel` has every replica it wants (or is gone)."""
        if kernel.degraded_since is None:
            return
        gone = not self._kernels.is_current(kernel) or kernel.dead
        if gone or len(kernel.linkable_replicas()) >= kernel.replicas_wanted:
            kernel.repaired()
            self._count_degraded()
            if not gone:
                log.info("kernel %s: repaired, it runs on every replica it wants", kernel.id)
                self._events.publish(EventType.KERNEL_REPAIRED, {}, kernel_id=kernel.id)

    @contextlib.asynccontextmanager
    async def _lifecycle_if_current(
        self, kernel: KernelRecord, lost: ReplicaRecord
    ) -> AsyncIterator[bool]:
        """Hold the kernel's lifecycle lock; yield whether `lost` still needs replacing."""
        async with kernel.lifecycle:
            yield self._kernels.is_current(kernel) and lost in kernel.replicas

    async def _forget(self, kernel: KernelRecord, lost: ReplicaRecord) -> None:
        """Tell the live replicas not to wait for a delta `lost` may have owed."""
        results = await asyncio.gather(
            *(
                send_request(
                    self._context, r.connection, Request.FORGET,
                    ForgetContent(replicas=[lost.id]), self._replication.join_timeout,
                    f"replica {r.id} forgetting {lost.id}",
                )
                for r in kernel.live_replicas()
            ),
            return_exceptions=True,
        )  # fmt: skip
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.warning("kernel %s: %s", kernel.id, failure)

    # ---- moves -----------------------------------------------------------------------------

    async def migrate(self, kernel_id: str, replica_id: str, host_id: str | None) -> KernelRecord:
        """Move one replica of a replicated kernel to `host_id` (or where the policy places it).

        A new replica joins the group and catches up, the kernel is relinked if the old one ran
        it, the old one stops, and then leaves the group (it may have led it: a leader cannot be
        removed while it leads). `NotFound` for unknown
        ids, `Conflict` for a dead replica or a host that is lost or already holds one.
        """
        kernel = self._kernels.get(kernel_id)
        async with kernel.lifecycle:
            old = next((r for r in kernel.replicas if r.id == replica_id), None)
            if old is None:
                raise NotFound(f"kernel {kernel_id} has no replica {replica_id!r}")
            if not kernel.replicated or old.state is not ReplicaState.READY:
                raise Conflict(f"replica {replica_id} cannot move: it is {old.state.value}")
            if host_id is not None:
                self._check_migration_target(kernel, host_id)
            async with self._cells_held(kernel):
                await self._move(kernel, old, host_id)
        log.info("kernel %s: replica %s moved", kernel_id, replica_id)
        return kernel

    async def move_replica(self, kernel: KernelRecord, replica: ReplicaRecord, host: str) -> None:
        """Move `replica` to `host` for a cell of `kernel` (the policy's `Migrate`)."""
        async with kernel.lifecycle:
            await self._move(kernel, replica, host)

    def check_drainable(self, host_id: str) -> list[tuple[KernelRecord, ReplicaRecord]]:
        """The replicas `drain_host` would move off `host_id`; `NotFound` for an unknown host,
        `Conflict` if it is neither alive nor draining already (lost, stopping), a kernel
        there has a single replica (it cannot move without losing its state), or a replica is
        being started there (a migration to it, say: the host is not idle after all)."""
        host = self._hosts.get(host_id)
        if host.state not in (HostState.ALIVE, HostState.DRAINING):
            raise Conflict(f"host {host_id} is {host.state.value}: it cannot be drained")
        arriving = self._launcher.arriving(host_id)
        if arriving:
            raise Conflict(f"host {host_id} is starting {arriving} replica(s)")
        leaving = self._kernels.live_replicas_on(host_id)
        unmovable = sorted(kernel.id for kernel, _ in leaving if not kernel.replicated)
        if unmovable:
            raise Conflict(
                f"host {host_id} runs single-replica kernel(s) {', '.join(unmovable)}, which "
                "cannot move without losing their state"
            )
        return leaving

    async def drain_host(self, host_id: str) -> int:
        """Move every replica off `host_id`, add-first with state kept, so it can be stopped;
        return how many moved.

        From the start the host is DRAINING: it takes no new replica and runs no new cell, and
        it stays so until it is stopped, lost, forgotten (`HostRegistry.forget`) or reopened
        (`reopen_host`). Refused before anything moves as `check_drainable` says. If a move
        fails, or the drain is cancelled, the host is ALIVE again and the error propagates;
        replicas already moved stay moved."""
        leaving = self.check_drainable(host_id)
        host = self._hosts.get(host_id)
        if host.state is HostState.ALIVE:
            host.move_to(HostState.DRAINING)
        self._events.publish(EventType.HOST_DRAINING, {"replicas": len(leaving)}, host_id=host_id)
        self._capacity.capacity_changed()
        try:
            for kernel, replica in leaving:
                if self._kernels.is_current(kernel) and replica in kernel.replicas:
                    await self.migrate(kernel.id, replica.id, None)
        except BaseException:
            self.reopen_host(host_id)
            raise
        log.info("host %s drained: %d replica(s) moved away", host_id, len(leaving))
        self._events.publish(EventType.HOST_DRAINED, {"moved": len(leaving)}, host_id=host_id)
        return len(leaving)

    def reopen_host(self, host_id: str) -> bool:
        """A DRAINING host takes work again; return whether it was draining."""
        host = self._hosts.get(host_id)
        if host.state is not HostState.DRAINING:
            return False
        host.move_to(HostState.ALIVE)
        self._capacity.capacity_changed()
        return True

    def _cells_held(self, kernel: KernelRecord) -> AbstractAsyncContextManager[None]:
        """No cell starts while the body runs (once the running one ended)."""
        if kernel.link is None:
            return contextlib.nullcontext()
        return kernel.link.cells.paused()

    async def _move(self, kernel: KernelRecord, old: ReplicaRecord, host_id: str | None) -> None:
        """Add-first: a new replica joins and catches up, the old one stops and leaves."""
        started = time.monotonic()
        try:
            new = await self._replace(kernel, old, host_id, old_alive=True)
        except BaseException:
            self._metrics.migrations.labels(outcome="failed").inc()
            raise
        self._metrics.migrations.labels(outcome="succeeded").inc()
        if kernel.executor == old.id:
            kernel.executor = new.id  # the successor is as warm, and the policy chose its host
        kernel.lost_replicas.append(old.id)
        if kernel.link is not None:
            kernel.link.remove_replica(old.id, f"its replica {old.id} moved")
        await self._forget(kernel, old)
        await self._launcher.stop(kernel, [old])
        await self._remove_member(kernel, old)
        self._metrics.migration_time.observe(time.monotonic() - started)
        self._kernels.persist()
        self._moved(EventType.REPLICA_MIGRATED, kernel, old, new)

    def _moved(
        self, event_type: EventType, kernel: KernelRecord, old: ReplicaRecord, new: ReplicaRecord
    ) -> None:
        self._events.publish(
            event_type,
            {
                "replica_id": new.id,
                "replaced": old.id,
                "from_host": old.host_id,
                "to_host": new.host_id,
            },
            kernel_id=kernel.id,
            host_id=new.host_id,
        )

    def _check_migration_target(self, kernel: KernelRecord, host_id: str) -> None:
        host = self._hosts.get(host_id)
        if not host.alive:
            raise Conflict(f"host {host_id} is {host.state.value}")
        if host_id in {replica.host_id for replica in kernel.replicas}:
            raise Conflict(f"host {host_id} already holds a replica of kernel {kernel.id}")

    async def _replace(
        self,
        kernel: KernelRecord,
        old: ReplicaRecord,
        host_id: str | None = None,
        old_alive: bool = False,
    ) -> ReplicaRecord:
        """Launch a replica on `host_id` (default: where the policy places it among hosts
        that hold no other replica of the kernel: a dead `old`'s own host may), swap it into
        the group in place of `old`, and let it catch up from the log
        (its state is ``catching-up`` until then).

        A dead `old` leaves the group first. A live one may be the Raft leader, which cannot
        be removed while it leads: it stays a member, for the caller to stop and then remove
        (`_remove_member`)."""
        if host_id is None:
            # Not beside another live replica of the kernel; a dead one's host (still alive,
            # say, after its process was killed) may take its successor.
            used = {r.host_id for r in kernel.replicas if old_alive or r is not old}
            host_id = self._admission.place_replica(kernel, used)
        new = await self._launcher.launch(kernel, host_id, joining=True)
        index = kernel.replicas.index(old)
        kernel.replicas[index] = new
        live = kernel.linkable_replicas()
        through = Member(live[0].id, live[0].raft_address or "", live[0].connection)
        timeout = self._replication.join_timeout
        try:
            remove = [] if old_alive else [old.raft_address or ""]
            members = await change_members(
                self._context, through, remove, [new.raft_address or ""], timeout
            )
            existing = tuple(m for m in members if m != new.raft_address)
            member = Member(new.id, new.raft_address or "", new.connection)
            await join_group(
                self._context, [member], kernel.raft_password, self._replication.store_root,
                timeout, existing=existing, forget=tuple(kernel.lost_replicas),
            )  # fmt: skip
            if kernel.link is not None:
                await kernel.link.add_replica(new.id, new.connection, self._launch_timeout)
        except BaseException:
            kernel.replicas[index] = old
            await self._launcher.stop(kernel, [new])
            await self._withdraw(kernel, through, new)  # a no-op if it never got in
            raise
        new.move_to(ReplicaState.READY)
        log.info("kernel %s: replica %s on %s replaced %s", kernel.id, new.id, host_id, old.id)
        return new

    async def _withdraw(self, kernel: KernelRecord, through: Member, new: ReplicaRecord) -> None:
        """Take a replacement that failed to join back out of the group. Left in, it would
        count as a member that never answers: one more such failure and the live replicas
        are no longer a majority, and the kernel can commit nothing (seen by the chaos soak)."""
        try:
            await change_members(
                self._context, through, [new.raft_address or ""], [],
                self._replication.join_timeout,
            )  # fmt: skip
        except FleetError as e:
            log.error(
                "kernel %s: the failed replacement %s could not be taken out of its Raft "
                "group: %s", kernel.id, new.id, e,
            )  # fmt: skip

    async def _remove_member(self, kernel: KernelRecord, gone: ReplicaRecord) -> None:
        """Take a stopped replica's address out of the group, through a live member."""
        live = next(r for r in kernel.replicas if r.state is ReplicaState.READY)
        through = Member(live.id, live.raft_address or "", live.connection)
        await change_members(
            self._context, through, [gone.raft_address or ""], [], self._replication.join_timeout
        )


def _lost(replica: ReplicaRecord, why: str) -> str:
    return f"replica {replica.id} on {replica.host_id} died ({why})"
