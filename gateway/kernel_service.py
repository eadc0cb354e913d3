"""Kernels as the gateway runs them: placed on hosts by the policy, linked over ZMQ.

`KernelService` owns every `KernelRecord`. The HTTP handlers call its async methods; the host
registry tells it what the hosts report, so a replica that dies (or a host that goes silent)
shows up here as a dead kernel, announced to its clients with a ``status: dead`` message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import zmq.asyncio
from jupyter_client.session import Session

from kernelfleet.errors import (
    Conflict,
    FleetError,
    GpusUnavailable,
    HostUnavailable,
    InvalidRequest,
    KernelDead,
    KernelStartFailed,
    NoCapacity,
    NotFound,
)
from kernelfleet.gateway.cells import Cell
from kernelfleet.gateway.channels import ClientLink, ConnectionInfo, Deliver, KernelLink, OnClosed
from kernelfleet.gateway.executors import ExecutorChooser
from kernelfleet.gateway.framing import KernelMessage, kernel_message_from_dict
from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.kernelspecs import KernelSpecCatalog
from kernelfleet.gateway.ledger import GpuLedger, device_ids_of
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import (
    KernelRecord,
    ReplicaRecord,
    ReplicationSettings,
    gpu_need,
)
from kernelfleet.gateway.replication import (
    Member,
    ask,
    change_members,
    join_group,
    new_group_password,
)
from kernelfleet.gateway.store import KernelStore
from kernelfleet.scheduler import (
    FleetSnapshot,
    HostSnapshot,
    Placement,
    PlacementRequest,
    Policy,
    Queue,
    Reject,
)
from kernelfleet.scheduler.usage import UsageWindow

log = logging.getLogger("kernelfleet.gateway.kernels")

ADMISSION_RECHECK = 0.5
"""Seconds between asking the policy again for a kernel waiting to be placed."""


class KernelService:
    """Starts, tracks, interrupts, restarts and stops kernels."""

    def __init__(
        self,
        hosts: HostRegistry,
        policy: Policy,
        kernelspecs: KernelSpecCatalog,
        launch_timeout: float,
        allowed_env: set[str],
        replication: ReplicationSettings | None = None,
        store: KernelStore | None = None,
        metrics: FleetMetrics | None = None,
        check_ledger: bool = False,
        usage: UsageWindow | None = None,
    ) -> None:
        self._hosts = hosts
        self._policy = policy
        self._kernelspecs = kernelspecs
        self._launch_timeout = launch_timeout
        self._allowed_env = allowed_env
        self._replication = replication or ReplicationSettings()
        self._store = store
        self._kernels: dict[str, KernelRecord] = {}
        self._context = zmq.asyncio.Context()
        self._background: set[asyncio.Future[None]] = set()
        self._status_session = Session(username="kernelfleet")
        self.usage = usage or UsageWindow(1)
        """Demand and busy GPUs over a moving window, for the subscription ratio."""
        self._draining: set[str] = set()
        """Hosts being emptied to be stopped: no new replica or cell goes there."""
        self.addable_host_size: Callable[[], int] = lambda: 0
        """GPUs of a host the autoscaler could add now; 0 when none can be (set by the app)."""
        self.hosts_pending: Callable[[], int] = lambda: 0
        """Hosts being added that have not registered yet (set by the app)."""
        self._admitting: dict[str, int] = {}
        """GPUs of kernels waiting for a host to be placed on, by kernel id."""
        self._given_up: set[str] = set()
        """Replicas declared dead because their host went silent; stopped if it comes back."""
        self._arriving: Counter[str] = Counter()
        """Replicas being started, by host (not in the ledger yet)."""
        self.metrics = metrics or FleetMetrics()
        self.ledger = GpuLedger(check_ledger, lambda _: self.metrics.ledger_breaches.inc())
        self._chooser = ExecutorChooser(policy, self.ledger, self, self.metrics)

    # ---- queries ---------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    def get(self, kernel_id: str) -> KernelRecord:
        try:
            return self._kernels[kernel_id]
        except KeyError:
            raise NotFound(f"no kernel with id {kernel_id!r}") from None

    def all(self) -> list[KernelRecord]:
        return list(self._kernels.values())

    def snapshot(self) -> FleetSnapshot:
        """The fleet as policies see it: each host's GPUs from the ledger (subscribed by idle
        replicas, committed to running cells), and the GPUs that waiting cells ask for. A host
        being drained shows as not alive, so nothing new is placed or run there."""
        hosts = []
        for host in self._hosts.all():
            alive = host.alive and host.id not in self._draining
            if host.id in self.ledger.hosts():
                hosts.append(self.ledger.host_snapshot(host.id, alive))
            else:
                hosts.append(HostSnapshot(id=host.id, gpus_total=len(host.gpus), alive=alive))
        return FleetSnapshot(
            hosts=tuple(hosts),
            gpus_per_host=self.addable_host_size(),
            hosts_pending=self.hosts_pending(),
            demand_gpus=self.usage.demand,
            busy_gpus=self.usage.busy,
            gpus_waiting=self._chooser.waiting_gpus + sum(self._admitting.values()),
        )

    def sample_usage(self) -> None:
        """Add the GPUs subscribed by every replica (demand) and committed now (busy) to the
        moving window; the caller calls this at a fixed interval."""
        totals = self.ledger.totals()
        self.usage.add(totals.demand, totals.committed)

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, name: str | None, env: Any) -> KernelRecord:
        """Place and launch a kernel; returns once it answered and IOPub is subscribed."""
        name = self._kernelspecs.resolve(name)
        env = self._checked_env(env)
        launch_name, replicas = self._replication.plan(name)
        kernel = KernelRecord(
            id=str(uuid.uuid4()),
            name=name,
            env=env,
            launch_name=launch_name,
            replicas_wanted=replicas,
            gpus=gpu_need(env),
        )
        placement = await self._admit(kernel)
        self._kernels[kernel.id] = kernel
        started = time.monotonic()
        try:
            await self._launch_group(kernel, placement.host_ids)
            if self._chooser.per_session and kernel.gpus:
                await self._reserve(kernel)
        except BaseException:
            self._kernels.pop(kernel.id, None)
            self.ledger.remove_kernel(kernel.id)
            raise
        self.metrics.kernel_start.observe(time.monotonic() - started)
        self.persist()
        log.info("kernel %s (%s) started on %s", kernel.id, name, ", ".join(placement.host_ids))
        return kernel

    async def _reserve(self, kernel: KernelRecord) -> None:
        """Commit the kernel's GPUs for its whole life on its first replica's host (per-session
        policies); if another kernel took them since placement, stop it: `NoCapacity`."""
        try:
            self._chooser.reserve(kernel, kernel.replicas[0])
        except GpusUnavailable as e:
            await self._stop_replicas(kernel)
            raise NoCapacity(f"kernel {kernel.id}: {e.message}") from e
        kernel.executor = kernel.replicas[0].id

    async def _admit(self, kernel: KernelRecord) -> Placement:
        """Where the policy places the kernel. While it asks for hosts the autoscaler can add
        (or waits for capacity on a fleet that can grow), wait, up to the launch timeout,
        with the kernel's GPUs counted as waiting demand; then `NoCapacity` saying why."""
        request = PlacementRequest(kernel.id, replicas=kernel.replicas_wanted, gpus=kernel.gpus)
        deadline = time.monotonic() + self._launch_timeout
        try:
            while True:
                snapshot = self.snapshot()
                decision = self._policy.admit(snapshot, request)
                if isinstance(decision, Placement):
                    return decision
                grows = snapshot.gpus_per_host > 0 or snapshot.hosts_pending > 0
                if isinstance(decision, Reject) or not grows:
                    return self._policy.place(snapshot, request)  # raises NoCapacity: why
                if time.monotonic() > deadline:
                    why = decision.detail if isinstance(decision, Queue) else "hosts are missing"
                    raise NoCapacity(
                        f"kernel {kernel.id}: no host could take it within "
                        f"{self._launch_timeout:.0f} s ({why})"
                    )
                self._admitting[kernel.id] = kernel.gpus
                await asyncio.sleep(ADMISSION_RECHECK)
        finally:
            self._admitting.pop(kernel.id, None)

    def _place(self, kernel: KernelRecord) -> Placement:
        request = PlacementRequest(kernel.id, replicas=kernel.replicas_wanted, gpus=kernel.gpus)
        return self._policy.place(self.snapshot(), request)

    async def _launch_group(self, kernel: KernelRecord, host_ids: tuple[str, ...]) -> None:
        """Launch one replica per host, join them to a new Raft group if replicated, and link.

        On failure every replica launched is stopped again and the error propagates.
        """
        try:
            results = await asyncio.gather(
                *(self._launch_replica(kernel, host_id) for host_id in host_ids),
                return_exceptions=True,
            )
            kernel.replicas = [r for r in results if isinstance(r, ReplicaRecord)]
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            if kernel.replicated:
                await self._form_group(kernel)
            await self._link(kernel)
        except BaseException:
            await self._stop_replicas(kernel)
            raise

    async def _form_group(self, kernel: KernelRecord) -> None:
        members = [
            Member(replica.id, replica.raft_address or "", replica.connection)
            for replica in kernel.replicas
        ]
        if not all(member.raft_address for member in members):
            raise KernelStartFailed(f"kernel {kernel.id}: a host gave a replica no Raft address")
        settings = self._replication
        kernel.raft_password = new_group_password()
        kernel.lost_replicas = []
        await join_group(
            self._context, members, kernel.raft_password, settings.store_root, settings.join_timeout
        )

    async def interrupt(self, kernel_id: str) -> None:
        """Cancel the kernel's cells still waiting in the gateway, and interrupt the replica
        running one (or the last executor, as a plain kernel would be interrupted)."""
        kernel = self.get(kernel_id)
        if kernel.link is not None:
            kernel.link.cells.cancel_waiting("interrupted while waiting to run")
        replica = self._running_replica(kernel)
        await self._hosts.get(replica.host_id).client.interrupt_replica(replica.id)

    async def restart(self, kernel_id: str) -> KernelRecord:
        """Restart every replica with an empty namespace.

        A replica whose host is lost, or whose agent no longer knows it (the agent restarted), is
        replaced by a new one wherever the policy places it.
        """
        kernel = self.get(kernel_id)
        async with kernel.lifecycle:
            self.get(kernel_id)  # still there: a shutdown may have won the lock
            kernel.execution_state = "restarting"
            self._announce(kernel, "restarting")
            old_connections = [replica.connection for replica in kernel.replicas]
            try:
                if kernel.replicated:
                    # A new group: the old replicas' journals would replay the old state.
                    await self._stop_replicas(kernel)
                    await self._launch_group(kernel, self._place(kernel).host_ids)
                else:
                    for index, replica in enumerate(list(kernel.replicas)):
                        kernel.replicas[index] = await self._restart_replica(kernel, replica)
                    unlinked = kernel.link is None or any(
                        replica.id not in kernel.link.feeds for replica in kernel.replicas
                    )  # its replica died and left the link
                    if unlinked or [r.connection for r in kernel.replicas] != old_connections:
                        await self._link(kernel)
                    elif kernel.link is not None:
                        await kernel.link.nudge(self._launch_timeout)
                        kernel.link.cells.cancel_waiting("the kernel restarted")
            except BaseException:
                kernel.execution_state = "dead" if kernel.dead else "idle"
                self._announce(kernel, kernel.execution_state)
                raise
            kernel.execution_state = "idle"
            kernel.executor = None
            self._announce(kernel, "idle")
            self.persist()
            return kernel

    async def shutdown(self, kernel_id: str) -> None:
        kernel = self.get(kernel_id)
        async with kernel.lifecycle:
            if self._kernels.pop(kernel_id, None) is None:
                return  # another shutdown finished first
            if kernel.link is not None:
                kernel.link.close("the kernel was shut down")
            await self._stop_replicas(kernel)
        self.ledger.remove_kernel(kernel_id)
        self._chooser.capacity_changed()
        self.persist()
        log.info("kernel %s shut down", kernel_id)

    async def shutdown_all(self) -> None:
        await asyncio.gather(
            *(self.shutdown(k) for k in list(self._kernels)), return_exceptions=True
        )
        self._context.term()

    def close(self) -> None:
        """Let go of every kernel without stopping it; the store keeps them for the next gateway."""
        self.persist()
        for kernel in self._kernels.values():
            if kernel.link is not None:
                kernel.link.close("the gateway stopped")
        self._context.term()

    def attach(
        self, kernel_id: str, session_id: str, deliver: Deliver, on_closed: OnClosed
    ) -> ClientLink:
        """Connect a websocket client to the kernel's channels (see `KernelLink.attach`)."""
        kernel = self.get(kernel_id)
        if kernel.link is None:
            raise KernelDead(f"kernel {kernel_id} has no running replica")
        return kernel.link.attach(session_id, deliver, on_closed)

    # ---- durability ------------------------------------------------------------------------

    def persist(self) -> None:
        """Write every kernel to the store (after each change; cheap: small JSON)."""
        if self._store is not None:
            self._store.save([kernel.to_state() for kernel in self._kernels.values()])

    async def recover(self, grace: float) -> None:
        """Adopt the kernels a previous gateway left running.

        Waits up to `grace` seconds for their hosts to re-register (agents heartbeat on their
        own), then links each kernel to a live replica; one with none left is reported dead.
        """
        if self._store is None:
            return
        kernels = [KernelRecord.from_state(state) for state in self._store.load()]
        if not kernels:
            return
        wanted = {replica.host_id for kernel in kernels for replica in kernel.replicas}
        deadline = asyncio.get_running_loop().time() + grace
        while asyncio.get_running_loop().time() < deadline:
            if wanted <= {host.id for host in self._hosts.all() if host.alive}:
                break
            await asyncio.sleep(0.1)
        alive = {host.id for host in self._hosts.all() if host.alive}
        for kernel in kernels:
            for replica in kernel.replicas:
                if replica.host_id not in alive:
                    replica.state = "dead"
                else:
                    self._subscribe(kernel, replica)
            self._kernels[kernel.id] = kernel
            try:
                await self._link(kernel)
            except FleetError as e:
                log.error("kernel %s could not be adopted: %s", kernel.id, e)
                kernel.execution_state = "dead"
            else:
                log.info("kernel %s adopted from the previous gateway", kernel.id)
        self.persist()

    # ---- what the hosts tell us ------------------------------------------------------------

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        """Apply a host's report. After an agent restart, replicas it does not list are dead."""
        self._stop_given_up(host, restarted)
        vanished = self.ledger.set_host(host.id, device_ids_of(host.gpus))
        if vanished:
            log.error("host %s no longer reports GPU(s) %s", host.id, ", ".join(vanished))
        self._chooser.capacity_changed()
        reported = {model.get("id"): model for model in host.replicas if isinstance(model, dict)}
        for kernel in self._kernels.values():
            for replica in kernel.replicas:
                if replica.host_id != host.id or replica.state == "dead":
                    continue
                model = reported.get(replica.id)
                if model is not None:
                    replica.update(model)
                    if replica.state == "dead":
                        why = f"its process exited ({model.get('exit_code')})"
                        self._replica_died(kernel, replica, why)
                elif restarted:
                    replica.state = "dead"
                    self._replica_died(kernel, replica, f"the agent on {host.id} restarted")

    def on_host_lost(self, host: HostRecord) -> None:
        self._draining.discard(host.id)
        self.ledger.drop_host(host.id)
        self._chooser.capacity_changed()
        for kernel in self._kernels.values():
            for replica in kernel.replicas:
                if replica.host_id == host.id and replica.state != "dead":
                    replica.state = "dead"
                    self._given_up.add(replica.id)
                    self._replica_died(kernel, replica, f"host {host.id} stopped answering")

    def _stop_given_up(self, host: HostRecord, restarted: bool) -> None:
        """A host that was lost and came back may still run replicas given up for dead (they
        were replaced, and their GPUs went back to the pool): stop them."""
        if restarted:  # its replicas died with the agent
            self._given_up -= {m.get("id") for m in host.replicas if isinstance(m, dict)}
            return
        for model in host.replicas:
            replica_id = model.get("id") if isinstance(model, dict) else None
            if replica_id in self._given_up and model.get("state") in ("starting", "ready"):
                self._given_up.discard(replica_id)
                log.warning("host %s still runs replica %s, given up for dead: stopping it",
                            host.id, replica_id)  # fmt: skip
                self._in_background(self._stop_stray(host, replica_id))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on its own, keeping a reference until it ends (repairs, clean-ups)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_stray(self, host: HostRecord, replica_id: str) -> None:
        try:
            await host.client.stop_replica(replica_id)
        except FleetError as e:
            log.error("could not stop replica %s on %s: %s", replica_id, host.id, e)

    # ---- internals -------------------------------------------------------------------------

    def _checked_env(self, env: Any) -> dict[str, str]:
        if env is None:
            return {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise InvalidRequest("'env' must map variable names to string values")
        return {k: v for k, v in env.items() if k.startswith("KERNEL_") or k in self._allowed_env}

    async def _launch_replica(self, kernel: KernelRecord, host_id: str) -> ReplicaRecord:
        host = self._hosts.get(host_id)
        replica_id = f"{kernel.id[:8]}-{uuid.uuid4().hex[:6]}"
        self._arriving[host_id] += 1
        try:
            model = await host.client.start_replica(
                replica_id,
                kernel.id,
                kernel.launch_name,
                kernel.env,
                launch_timeout=self._launch_timeout,
                raft=kernel.replicated,
            )
        finally:
            self._arriving[host_id] -= 1
        replica = ReplicaRecord(
            id=replica_id,
            host_id=host_id,
            connection=ConnectionInfo.from_dict(model["connection"]),
            raft_address=model.get("raft_address"),
        )
        replica.update(model)
        self._subscribe(kernel, replica)
        return replica

    async def _restart_replica(self, kernel: KernelRecord, replica: ReplicaRecord) -> ReplicaRecord:
        host = self._hosts.get(replica.host_id)
        if host.alive:
            try:
                model = await host.client.restart_replica(
                    replica.id, launch_timeout=self._launch_timeout
                )
            except NotFound:
                log.warning("kernel %s: host %s forgot replica %s", kernel.id, host.id, replica.id)
            else:
                replica.update(model)
                replica.connection = ConnectionInfo.from_dict(model["connection"])
                self._subscribe(kernel, replica)
                return replica
        others = {r.host_id for r in kernel.replicas if r is not replica}
        snapshot = self.snapshot()
        candidates = FleetSnapshot(
            hosts=tuple(h for h in snapshot.hosts if h.id not in others), now=snapshot.now
        )
        placement = self._policy.place(candidates, PlacementRequest(kernel.id, gpus=kernel.gpus))
        log.warning("kernel %s: replacing replica %s on %s", kernel.id, replica.id, replica.host_id)
        return await self._launch_replica(kernel, placement.host_ids[0])

    async def _link(self, kernel: KernelRecord, why: str = "the kernel restarted") -> None:
        """Link the kernel to its live replicas. Clients of the previous link are told `why`
        for any cell still running, then disconnected so that they reconnect."""
        if kernel.link is not None:
            kernel.link.close(why)
        live = [r for r in kernel.replicas if r.state not in ("dead", "catching-up")]
        if not live:
            raise KernelDead(f"kernel {kernel.id} is dead: restart it or shut it down")
        link = KernelLink(
            kernel.id,
            self._context,
            lambda replica_id, message: self._on_iopub(kernel, replica_id, message),
            lambda cell: self._chooser.assign(kernel, cell),
            self._cell_started,
        )
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

    def _cell_started(self, cell: Cell) -> None:
        """The executor began `cell`: its start delay is the time since the gateway got it."""
        self.metrics.cell_start_delay.observe(time.monotonic() - cell.received_at)

    async def move_replica(self, kernel: KernelRecord, replica: ReplicaRecord, host: str) -> None:
        """Move `replica` to `host` for a cell of `kernel` (the policy's `Migrate`)."""
        async with kernel.lifecycle:
            await self._move(kernel, replica, host)

    async def release_memory(self, kernel_id: str, replica_id: str) -> None:
        """Ask a replica to move its GPU memory to the host (someone else's cell needs it)."""
        kernel = self.get(kernel_id)
        replica = next((r for r in kernel.replicas if r.id == replica_id), None)
        if replica is None or replica.state == "dead":
            return  # gone: its memory went with it
        await ask(
            self._context, replica.connection, "control", "kernelfleet_release", {},
            self._replication.join_timeout, f"replica {replica_id} releasing its GPUs",
        )  # fmt: skip

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

    def _running_replica(self, kernel: KernelRecord) -> ReplicaRecord:
        """The replica running the kernel's cell, else its last executor, else a live one."""
        running = kernel.link.cells.current_assignment if kernel.link is not None else None
        for wanted in (running.replica_id if running else None, kernel.executor):
            for replica in kernel.replicas:
                if replica.id == wanted and replica.state != "dead":
                    return replica
        return self._live_replica(kernel)

    def _live_replica(self, kernel: KernelRecord) -> ReplicaRecord:
        for replica in kernel.replicas:
            if replica.state != "dead":
                return replica
        raise KernelDead(f"kernel {kernel.id} is dead: restart it or shut it down")

    def _replica_died(self, kernel: KernelRecord, replica: ReplicaRecord, why: str) -> None:
        log.error(
            "kernel %s: replica %s on %s died: %s", kernel.id, replica.id, replica.host_id, why
        )
        self._unsubscribe(kernel, replica)
        self.persist()
        if kernel.dead:
            kernel.execution_state = "dead"
            if kernel.link is not None:  # its running cell ends, and later ones fail at once
                kernel.link.remove_replica(replica.id, f"the kernel's last replica died: {why}")
            self._announce(kernel, "dead")
        elif kernel.replicated:
            self._in_background(self._repair(kernel, replica))

    async def _repair(self, kernel: KernelRecord, lost: ReplicaRecord) -> None:
        """Fail over if `lost` ran the kernel, then replace it so the group has its size back."""
        async with kernel.lifecycle:
            if not self._is_current(kernel) or lost not in kernel.replicas:
                return  # shut down or restarted meanwhile
            kernel.lost_replicas.append(lost.id)
            if kernel.link is not None:
                kernel.link.remove_replica(lost.id, f"the replica running it ({lost.id}) was lost")
            try:
                await self._forget(kernel, lost)
                await self._replace(kernel, lost)
            except FleetError as e:
                live = sum(replica.state != "dead" for replica in kernel.replicas)
                log.error("kernel %s: runs on %d replica(s); repair failed: %s", kernel.id, live, e)
            finally:
                self.persist()

    def _is_current(self, kernel: KernelRecord) -> bool:
        """Whether `kernel` is still this service's record (not shut down meanwhile)."""
        return self._kernels.get(kernel.id) is kernel

    async def _forget(self, kernel: KernelRecord, lost: ReplicaRecord) -> None:
        """Tell the live replicas not to wait for a delta `lost` may have owed."""
        live = [r for r in kernel.replicas if r.state != "dead"]
        results = await asyncio.gather(
            *(
                ask(
                    self._context, r.connection, "control", "kernelfleet_forget",
                    {"replicas": [lost.id]}, self._replication.join_timeout,
                    f"replica {r.id} forgetting {lost.id}",
                )
                for r in live
            ),
            return_exceptions=True,
        )  # fmt: skip
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.warning("kernel %s: %s", kernel.id, failure)

    async def migrate(self, kernel_id: str, replica_id: str, host_id: str | None) -> KernelRecord:
        """Move one replica of a replicated kernel to `host_id` (or where the policy places it).

        A new replica joins the group and catches up, the kernel is relinked if the old one ran
        it, the old one stops, and then leaves the group (it may have led it: a leader cannot be
        removed while it leads). `NotFound` for unknown
        ids, `Conflict` for a dead replica or a host that is lost or already holds one.
        """
        kernel = self.get(kernel_id)
        async with kernel.lifecycle:
            old = next((r for r in kernel.replicas if r.id == replica_id), None)
            if old is None:
                raise NotFound(f"kernel {kernel_id} has no replica {replica_id!r}")
            if not kernel.replicated or old.state != "ready":
                raise Conflict(f"replica {replica_id} cannot move: it is {old.state}")
            if host_id is not None:
                self._check_migration_target(kernel, host_id)
            async with self._cells_held(kernel):
                await self._move(kernel, old, host_id)
        log.info("kernel %s: replica %s moved", kernel_id, replica_id)
        return kernel

    async def drain_host(self, host_id: str) -> None:
        """Move every replica off `host_id`, add-first with state kept, so it can be stopped.

        From the start the host takes no new replica and runs no new cell, and it stays so
        until it is lost or forgotten (`HostRegistry.forget`). `NotFound` for an unknown host;
        `Conflict`, before anything moves, if a kernel there has a single replica (it cannot
        move without losing its state) or a replica is being started there (a migration to it,
        say: the host is not idle after all). If a move fails the host takes work again, and
        the error propagates; replicas already moved stay moved."""
        self._hosts.get(host_id)
        if self._arriving[host_id]:
            raise Conflict(f"host {host_id} is starting {self._arriving[host_id]} replica(s)")
        leaving = [
            (kernel, replica)
            for kernel in list(self._kernels.values())
            for replica in kernel.replicas
            if replica.host_id == host_id and replica.state != "dead"
        ]
        unmovable = sorted(kernel.id for kernel, _ in leaving if not kernel.replicated)
        if unmovable:
            raise Conflict(
                f"host {host_id} runs single-replica kernel(s) {', '.join(unmovable)}, which "
                "cannot move without losing their state"
            )
        self._draining.add(host_id)
        self._chooser.capacity_changed()
        try:
            for kernel, replica in leaving:
                if kernel.id in self._kernels and replica in kernel.replicas:
                    await self.migrate(kernel.id, replica.id, None)
        except BaseException:
            self._draining.discard(host_id)
            self._chooser.capacity_changed()
            raise
        log.info("host %s drained: %d replica(s) moved away", host_id, len(leaving))

    def _cells_held(self, kernel: KernelRecord) -> Any:
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
            self.metrics.migrations.labels(outcome="failed").inc()
            raise
        self.metrics.migrations.labels(outcome="succeeded").inc()
        if kernel.executor == old.id:
            kernel.executor = new.id  # the successor is as warm, and the policy chose its host
        kernel.lost_replicas.append(old.id)
        if kernel.link is not None:
            kernel.link.remove_replica(old.id, f"its replica {old.id} moved")
        await self._forget(kernel, old)
        await self._stop_replicas_of(kernel, [old])
        await self._remove_member(kernel, old)
        self.metrics.migration_time.observe(time.monotonic() - started)
        self.persist()

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
        """Launch a replica on `host_id` (default: where the policy places it among hosts the
        kernel does not use), swap it into the group in place of `old`, and let it catch up
        from the log (its state is ``catching-up`` until then).

        A dead `old` leaves the group first. A live one may be the Raft leader, which cannot
        be removed while it leads: it stays a member, for the caller to stop and then remove
        (`_remove_member`)."""
        if host_id is None:
            used = {replica.host_id for replica in kernel.replicas}
            snapshot = self.snapshot()
            free = FleetSnapshot(tuple(h for h in snapshot.hosts if h.id not in used), snapshot.now)
            request = PlacementRequest(kernel.id, gpus=kernel.gpus)
            host_id = self._policy.place(free, request).host_ids[0]
        new = await self._launch_replica(kernel, host_id)
        new.state = "catching-up"
        index = kernel.replicas.index(old)
        kernel.replicas[index] = new
        live = [r for r in kernel.replicas if r.state not in ("dead", "catching-up")]
        try:
            through = Member(live[0].id, live[0].raft_address or "", live[0].connection)
            timeout = self._replication.join_timeout
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
            await self._stop_replicas_of(kernel, [new])
            raise
        new.state = "ready"
        log.info("kernel %s: replica %s on %s replaced %s", kernel.id, new.id, host_id, old.id)
        return new

    async def _remove_member(self, kernel: KernelRecord, gone: ReplicaRecord) -> None:
        """Take a stopped replica's address out of the group, through a live member."""
        live = next(r for r in kernel.replicas if r.state == "ready")
        through = Member(live.id, live.raft_address or "", live.connection)
        await change_members(
            self._context, through, [gone.raft_address or ""], [], self._replication.join_timeout
        )

    def _announce(self, kernel: KernelRecord, execution_state: str) -> None:
        """Publish a status message of the gateway's own to the kernel's clients."""
        if kernel.link is None:
            return
        msg = self._status_session.msg("status", content={"execution_state": execution_state})
        kernel.link.broadcast("iopub", kernel_message_from_dict(msg))

    async def _stop_replicas(self, kernel: KernelRecord) -> None:
        await self._stop_replicas_of(kernel, kernel.replicas)

    def _subscribe(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        """The replica claims its kernel's GPU need on its host (which the ledger learns of)."""
        if replica.host_id not in self.ledger.hosts():
            host = self._hosts.get(replica.host_id)
            self.ledger.set_host(host.id, device_ids_of(host.gpus))
        self.ledger.subscribe(replica.host_id, kernel.id, replica.id, kernel.gpus)

    def _unsubscribe(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        """The replica is gone (or going): its GPU claim and any binding go back to the pool."""
        self.ledger.unsubscribe(kernel.id, replica.id)
        self._chooser.capacity_changed()

    async def _stop_replicas_of(self, kernel: KernelRecord, replicas: list[ReplicaRecord]) -> None:
        for replica in replicas:
            self._unsubscribe(kernel, replica)

        async def stop(replica: ReplicaRecord) -> None:
            try:
                host = self._hosts.get(replica.host_id)
                if host.alive:
                    await host.client.stop_replica(replica.id)
            except (NotFound, HostUnavailable) as e:
                log.warning("kernel %s: could not stop replica %s: %s", kernel.id, replica.id, e)
            except FleetError as e:
                log.error("kernel %s: stopping replica %s failed: %s", kernel.id, replica.id, e)

        await asyncio.gather(*(stop(replica) for replica in replicas))
