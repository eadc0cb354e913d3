"""Kernels as the gateway runs them: placed on hosts by the policy, linked over ZMQ.

`KernelService` is what the HTTP handlers and the app call: a thin facade that wires the
collaborators doing the work, each in its own module:

- `KernelTable` (kernel_table): every `KernelRecord`, and their copy in the store;
- `FleetView` (fleet_view): the `FleetSnapshot` policies see, shared with the autoscaler;
- `Admission` (admission): where a kernel's replicas go, waiting for capacity that can come;
- `ReplicaLauncher` (launcher): starting, restarting and stopping replicas on their hosts;
- `KernelLinker` (links): a kernel's link to its live replicas, and its status messages;
- `GroupKeeper` (groups): repairs, migrations and draining hosts, for replicated kernels;
- `HostReconciler` (reconciler): what host reports and losses mean for the replicas;
- `ExecutorChooser` (executors): where each cell runs, and its GPUs while it runs.

The host registry reports to the reconciler, so a replica that dies (or a host that goes
silent) shows up here as a dead kernel, announced to its clients with a ``status: dead``
message, or as a replica replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from kernelfleet.errors import (
    Conflict,
    FleetError,
    GpusUnavailable,
    InvalidRequest,
    KernelDead,
    NoCapacity,
    NotFound,
)
from kernelfleet.gateway.admission import Admission
from kernelfleet.gateway.background import Background
from kernelfleet.gateway.channels import ClientLink, Deliver, OnClosed
from kernelfleet.gateway.demand import LiveDemand
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.executors import ExecutorChooser, JobPreemption
from kernelfleet.gateway.fleet_view import FleetView, HostGrowth
from kernelfleet.gateway.groups import GroupKeeper
from kernelfleet.gateway.hosts import HostRegistry
from kernelfleet.gateway.kernel_pool import KernelPool
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.gateway.kernelspecs import KernelSpecCatalog
from kernelfleet.gateway.launcher import ReplicaLauncher
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.links import KernelLinker
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.reconciler import HostReconciler
from kernelfleet.gateway.records import (
    KernelRecord,
    ReplicaRecord,
    ReplicaState,
    ReplicationSettings,
    gpu_need,
    start_facts,
)
from kernelfleet.gateway.store import KernelStore
from kernelfleet.limits import max_sockets
from kernelfleet.protocol import ErrorName
from kernelfleet.scheduler import FleetSnapshot, Policy
from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.usage import UsageWindow

log = logging.getLogger("kernelfleet.gateway.kernels")


class KernelService:
    """Starts, tracks, interrupts, restarts and stops kernels; see the module docstring.

    Building it makes its reconciler the `hosts` registry's listener."""

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
        kernel_tokens: KernelTokens | None = None,
        events: EventBus | None = None,
        pool_size: int = 0,
        pool_file: Path | None = None,
        pool_ceiling: int = 0,
    ) -> None:
        self._hosts = hosts
        self._policy = policy
        self._kernelspecs = kernelspecs
        self._launch_timeout = launch_timeout
        self._allowed_env = allowed_env
        self._replication = replication or ReplicationSettings()
        self.tokens = kernel_tokens
        """Issues each kernel its token (given to its replicas) and checks those presented;
        None: kernels get no token, and none is accepted."""
        self._context = zmq.asyncio.Context()
        self._context.set(zmq.MAX_SOCKETS, max_sockets(self._context.get(zmq.SOCKET_LIMIT)))
        self.metrics = metrics or FleetMetrics()
        self.events = events or EventBus()
        self.ledger = GpuLedger(check_ledger, self._ledger_breached)
        self._chooser = ExecutorChooser(policy, self.ledger, self, self.metrics, self.events)
        self._kernels = KernelTable(store)
        self._stopping: set[asyncio.Future[None]] = set()
        """The background stops of kernels shut down (`shutdown`), until each has ended."""
        self._relinking: dict[str, asyncio.Event] = {}
        """Kernels `restore` listed that `recover` has not re-linked yet: set once it has."""
        self._fleet = FleetView(
            hosts, self.ledger, self._chooser, usage or UsageWindow(1),
            self._replication.container_launches,
        )  # fmt: skip
        self._admission = Admission(policy, self._fleet, launch_timeout)
        self._linker = KernelLinker(
            self._context, self._chooser, self.metrics, launch_timeout, self.events, self._fence
        )
        self._launcher = ReplicaLauncher(
            hosts, self.ledger, self._chooser, self._linker, self._context,
            self._replication, launch_timeout, kernel_tokens, self.events,
        )  # fmt: skip
        background = self._background = Background()
        self._groups = GroupKeeper(
            self._kernels, hosts, self._admission, self._launcher, self._linker, self._chooser,
            self._context, self._replication, launch_timeout, self.metrics, background,
            self.events,
        )  # fmt: skip
        default = kernelspecs.resolve(None)
        self.pool = KernelPool(
            pool_size, default, self._replication.plan(kernelspecs.launch(default).base),
            self._admission, self._launcher, hosts, self._context, self.metrics, pool_file,
            pool_ceiling,
        )  # fmt: skip
        """Groups of the default kernelspec started ahead of kernel starts (`run` keeps it
        full once the app starts it; `close` stops them)."""
        hosts.listen(
            HostReconciler(
                self._kernels, self.ledger, self._chooser, self._groups, background, self.events
            )
        )

    def _ledger_breached(self, breach: str) -> None:
        self.metrics.ledger_breaches.inc()

    def count_demand_with(self, demand: LiveDemand) -> None:
        """From now on, tell `demand` (the autoscaler's model) of every cell submitted and
        every cell's GPUs released."""
        self._chooser.demand = demand

    def count_arrivals_with(self, arrivals: ArrivalWindow) -> None:
        """From now on, record every cell submitted in `arrivals`, which snapshots then carry
        (the autoscaler's warm capacity is sized from them)."""
        self._chooser.arrivals = arrivals
        self._fleet.arrivals = arrivals

    def preempt_jobs_with(self, jobs: JobPreemption) -> None:
        """Cells first: a cell that takes GPUs lent to background jobs has `jobs` stop them."""
        self._chooser.preempt_jobs_with(jobs)

    # ---- queries ---------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def usage(self) -> UsageWindow:
        """Demand and busy GPUs over a moving window, for the subscription ratio."""
        return self._fleet.usage

    def get(self, kernel_id: str) -> KernelRecord:
        return self._kernels.get(kernel_id)

    def all(self) -> list[KernelRecord]:
        return self._kernels.all()

    def kernel_of_token(self, token: str) -> str | None:
        """The kernel a kernel-scoped token belongs to, while that kernel exists; None (and a
        warning in the log saying why) for a forged token or one whose kernel is gone. The
        `kernelfleet.web.KernelTokenCheck` of the gateway's handlers."""
        kernel_id = self.tokens.verify(token) if self.tokens is not None else None
        if kernel_id is None:
            claimed = token.split(".")[1][:64] if token.count(".") == 2 else "?"
            log.warning("refused a forged kernel token (it claims kernel %r)", claimed)
            return None
        try:
            self._kernels.get(kernel_id)
        except NotFound:
            log.warning("refused the token of kernel %s, which no longer exists", kernel_id)
            return None
        return kernel_id

    def snapshot(self, kernel: KernelRecord | None = None) -> FleetSnapshot:
        """The fleet as policies see it (`FleetView.snapshot`), for `kernel` when given (a
        container kernel sees only hosts that can run it)."""
        return self._fleet.snapshot(kernel.launch_name if kernel is not None else "")

    def sample_usage(self) -> None:
        """Add the current demand and busy GPUs to the usage window (`FleetView`)."""
        self._fleet.sample_usage()

    def grow_with(self, growth: HostGrowth, max_hosts: int = 0) -> None:
        """Tell policies from now on the hosts `growth` (the autoscaler) adds, and admission
        that the fleet never has more than `max_hosts` (0: no limit)."""
        self._fleet.grow_with(growth)
        self._admission.max_hosts = max_hosts

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, name: str | None, env: Any) -> KernelRecord:
        """Place and launch a kernel; returns once it answered and IOPub is subscribed."""
        name = self._kernelspecs.resolve(name)
        notebook_path, user = start_facts(env)
        env = self._checked_env(env)
        launch = self._kernelspecs.launch(name)  # a GPU variant sets the kernel's GPUs
        if launch.gpus is not None:
            env["KERNEL_GPUS"] = str(launch.gpus)
        launch_name, replicas = self._replication.plan(launch.base)
        kernel = KernelRecord(
            id=str(uuid.uuid4()),
            name=name,
            env=env,
            launch_name=launch_name,
            replicas_wanted=replicas,
            gpus=gpu_need(env),
            notebook_path=notebook_path,
            user=user,
        )
        started = time.monotonic()
        pooled = await self._from_pool(kernel)
        if pooled is not None:
            kernel = pooled
            self._add(kernel)
        else:
            placement = await self._admission.admit(kernel)
            self._add(kernel)
            started = time.monotonic()
            try:
                await self._launcher.launch_group(kernel, placement.host_ids)
                if self._chooser.per_session and kernel.gpus:
                    await self._reserve(kernel)
            except BaseException:
                self._kernels.pop(kernel.id)
                self.ledger.remove_kernel(kernel.id)
                raise
        self.metrics.kernel_start.observe(time.monotonic() - started)
        self.metrics.kernel_starts.labels("pool" if pooled else "cold").inc()
        self._kernels.persist()
        log.info(
            "kernel %s (%s) started on %s%s", kernel.id, name,
            ", ".join(r.host_id for r in kernel.replicas), " from the pool" if pooled else "",
        )  # fmt: skip
        self.events.publish(
            EventType.KERNEL_STARTED,
            {
                "name": name,
                "replicas": [{"id": r.id, "host": r.host_id} for r in kernel.replicas],
                "gpus": kernel.gpus,
                "notebook_path": kernel.notebook_path,
                "user": kernel.user,
            },
            kernel_id=kernel.id,
        )
        return kernel

    async def _from_pool(self, kernel: KernelRecord) -> KernelRecord | None:
        """A pooled group bound to `kernel`'s start, or None (a cold start; the log says why
        when the pool is on)."""
        why = self.pool.unfit(kernel, self._chooser.per_session)
        if why is not None:
            if self.pool.size > 0:
                log.info("kernel start (%s) is cold: %s", kernel.name, why)
            return None
        return await self.pool.take(kernel)

    def _add(self, kernel: KernelRecord) -> None:
        """Add `kernel` to the table, its model reading the GPUs bound to it from the ledger."""
        kernel.gpus_held = functools.partial(self._gpus_held, kernel)
        self._kernels.add(kernel)

    def _gpus_held(self, kernel: KernelRecord) -> list[dict[str, Any]]:
        """``[{"host", "devices"}]``: the devices bound to `kernel`'s replicas right now."""
        held = []
        for replica in kernel.replicas:
            binding = self.ledger.binding(kernel.id, replica.id)
            if binding is not None and binding.device_ids:
                held.append({"host": binding.host_id, "devices": list(binding.device_ids)})
        return held

    async def _reserve(self, kernel: KernelRecord) -> None:
        """Commit the kernel's GPUs for its whole life on its first replica's host (per-session
        policies); if another kernel took them since placement, stop it: `NoCapacity`."""
        try:
            self._chooser.reserve(kernel, kernel.replicas[0])
        except GpusUnavailable as e:
            await self._launcher.stop(kernel, kernel.replicas)
            raise NoCapacity(f"kernel {kernel.id}: {e.message}") from e
        kernel.executor = kernel.replicas[0].id

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

        The kernel's clients see what a local kernel restarted through jupyter_server shows them:
        no ``restarting`` status (frontends take that one for a crash the server recovers from:
        JupyterLab shows "The kernel appears to have died"), the new kernel's own messages, and
        an ``idle`` status once it answers. Only the REST model says ``restarting`` meanwhile.
        """
        kernel = self.get(kernel_id)
        async with kernel.lifecycle:
            self.get(kernel_id)  # still there: a shutdown may have won the lock
            kernel.execution_state = "restarting"
            old_connections = [replica.connection for replica in kernel.replicas]
            try:
                if kernel.replicated:
                    # A new group: the old replicas' journals would replay the old state.
                    await self._launcher.stop(kernel, kernel.replicas)
                    await self._launcher.launch_group(
                        kernel, self._admission.place(kernel).host_ids
                    )
                else:
                    for index, replica in enumerate(list(kernel.replicas)):
                        kernel.replicas[index] = await self._restart_replica(kernel, replica)
                    unlinked = kernel.link is None or any(
                        replica.id not in kernel.link.feeds for replica in kernel.replicas
                    )  # its replica died and left the link
                    if unlinked or [r.connection for r in kernel.replicas] != old_connections:
                        await self._linker.link(kernel)
                    elif kernel.link is not None:
                        await kernel.link.nudge(self._launch_timeout)
                        kernel.link.cells.cancel_waiting("the kernel restarted")
            except BaseException:
                kernel.execution_state = "dead" if kernel.dead else "idle"
                self._linker.announce(kernel, kernel.execution_state)
                raise
            kernel.execution_state = "idle"
            kernel.executor = None
            self._linker.announce(kernel, "idle")
            self._kernels.persist()
            return kernel

    async def _restart_replica(self, kernel: KernelRecord, replica: ReplicaRecord) -> ReplicaRecord:
        """`replica` restarted in place, else a new one where the policy places it."""
        restarted = await self._launcher.restart(kernel, replica)
        if restarted is not None:
            return restarted
        others = {r.host_id for r in kernel.replicas if r is not replica}
        host_id = self._admission.place_replica(kernel, others)
        log.warning("kernel %s: replacing replica %s on %s", kernel.id, replica.id, replica.host_id)
        return await self._launcher.launch(kernel, host_id)

    async def shutdown(self, kernel_id: str, why: str = "the kernel was shut down") -> None:
        """Forget the kernel and have its replicas stopped; `NotFound` (at once) for a kernel
        this gateway does not know. Its clients are told first: a cell still running gets an
        error saying `why` (``KernelUnavailable``), then a ``dead`` status, which JupyterLab
        shows (as it shows a kernel that vanished from the server's list), and their websockets
        close.

        Returns once the kernel is out of the table (and the store) and its replicas' stops are
        under way, as fast as a local kernel's shutdown answers; the stopping finishes in the
        background (`stopped` waits for it). Its GPUs stay held in the ledger until each
        replica's host said that replica's process is gone, so no other cell gets a GPU it may
        still use; its user and ports are the hosts' until then too (a host agent frees them
        when the process is reaped)."""
        kernel = self.get(kernel_id)
        async with kernel.lifecycle:
            if self._kernels.pop(kernel_id) is None:
                return  # another shutdown finished first
            kernel.execution_state = "dead"
            self._chooser.hold_until_stopped(kernel_id)
            if kernel.link is not None:
                kernel.link.close(why, ename=ErrorName.KERNEL_UNAVAILABLE, last_status="dead")
            self._kernels.persist()
            stopping = asyncio.ensure_future(self._stop_replicas(kernel))
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)
        log.info("kernel %s shut down; its replicas are stopping", kernel_id)
        self.events.publish(EventType.KERNEL_STOPPED, {"why": "shut down"}, kernel_id=kernel_id)

    async def _stop_replicas(self, kernel: KernelRecord) -> None:
        """Stop a shut-down kernel's replicas, then give back what the ledger still holds."""
        started = time.monotonic()
        try:
            await self._launcher.stop(kernel, kernel.replicas, release_after_stop=True)
        finally:
            self._chooser.stopped(kernel.id)
            self._chooser.released(self.ledger.remove_kernel(kernel.id))
            self._chooser.capacity_changed()
        log.info("kernel %s: its replicas stopped in %.2f s", kernel.id, time.monotonic() - started)

    async def stopped(self) -> None:
        """Return once every replica of the kernels shut down so far has stopped."""
        while self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)

    async def shutdown_all(self) -> None:
        """Shut every kernel down, as the gateway stops (`shutdown`: their clients see them
        dead, and a running cell fails saying why), and wait until their replicas stopped."""
        why = "the gateway stopped, and shut its kernels down with it"
        await asyncio.gather(
            *(self.shutdown(k, why) for k in self._kernels.ids()), return_exceptions=True
        )
        await self.stopped()
        self._context.term()

    def close(self) -> None:
        """Let go of every kernel without stopping it; the store keeps them for the next gateway.

        A cell still running gets an error saying so (``KernelUnavailable``); the clients'
        websockets close, and jupyter_server's relay reconnects once a gateway runs again. No
        ``dead`` status: the kernel lives on."""
        self._kernels.persist()
        why = (
            "the gateway stopped while this cell ran: the kernel keeps running, and a gateway "
            "started again adopts it, but this cell's outputs and reply are lost"
        )
        for kernel in self._kernels.all():
            if kernel.link is not None:
                kernel.link.close(why, ename=ErrorName.KERNEL_UNAVAILABLE)
        self._context.term()

    def attach(
        self, kernel_id: str, session_id: str, deliver: Deliver, on_closed: OnClosed
    ) -> ClientLink:
        """Connect a websocket client to the kernel's channels (see `KernelLink.attach`)."""
        kernel = self.get(kernel_id)
        if kernel.link is None:
            raise KernelDead(f"kernel {kernel_id} has no running replica")
        kernel.link.lifecycle = self  # a client's shutdown_request stops the whole kernel
        return kernel.link.attach(session_id, deliver, on_closed)

    def restore(self) -> int:
        """Put the kernels a previous gateway left running in the table, as they were stored,
        before the gateway answers its first request: each is listed, and answers
        ``GET /api/kernels/{id}``, with `execution_state` ``"starting"`` until `recover` has
        re-linked it (``"dead"`` if every replica was dead already). Returns how many.

        `StateUnreadable` (naming the file) if the state file cannot be read: the caller stops.
        """
        kernels = self._kernels.stored()
        for kernel in kernels:
            kernel.execution_state = "dead" if kernel.dead else "starting"
            self._add(kernel)
            if not kernel.dead:
                self._relinking[kernel.id] = asyncio.Event()
        if kernels:
            log.info("%d kernel(s) of the previous gateway listed; re-linking them", len(kernels))
        return len(kernels)

    def _fence(self, kernel: KernelRecord, replica_id: str, seconds: float) -> None:
        """A linked replica answered no heartbeat for `seconds` (frozen, or its host wedged):
        it is lost to its kernel now (dead, failed over, replaced) and stopped on its host,
        so that it cannot come back and act on an old state."""
        replica = next((r for r in kernel.replicas if r.id == replica_id), None)
        if replica is None or replica.state is not ReplicaState.READY:
            return  # gone, or restarting: its silence means nothing yet
        if not self._kernels.is_current(kernel) or kernel.lifecycle.locked():
            return  # shut down, or a restart or move is under way: told again if still silent
        replica.move_to(ReplicaState.DEAD)
        why = f"it answered no heartbeat for {seconds:.0f} s (frozen or wedged): it is stopped"
        self._groups.replica_died(kernel, replica, why)
        self._background.run(self._stop_fenced(kernel, replica))

    async def _stop_fenced(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        try:
            await self._hosts.get(replica.host_id).client.stop_replica(replica.id)
        except FleetError as e:
            log.error("kernel %s: could not stop replica %s: %s", kernel.id, replica.id, e)

    async def recover(self, grace: float) -> None:
        """Re-link every kernel `restore` listed, all at once.

        For each kernel: wait up to `grace` seconds for the hosts of its replicas to report
        (agents heartbeat on their own, and re-register with a new gateway). A replica is
        known dead when its host reported without it, or never came back within `grace`: the
        log says which. The kernel is then linked to the replicas left, holding its lifecycle
        lock meanwhile (a shutdown or a repair waits for it); one whose replicas are all known
        dead is reported dead, a replicated one missing some is repaired as after any loss.

        GPU ledger: the hosts' reports give the ledger its devices and `launcher.subscribe`
        the replicas' claims again. Commitments of cells in flight when the previous gateway
        died are not stored, and need not be: a per-cell commitment is released by its cell's
        reply, which went to the dead gateway's link and reaches no one now, so a stored one
        could never be released; the orphaned cell runs to its end on its replica, whose next
        cell queues behind it in the kernel itself. Per-session commitments (policies that
        hold a kernel's GPUs for its whole life) are taken again here, on the kernel's
        executor, as its start took them.
        """
        deadline = time.monotonic() + grace
        kernels = [self._kernels.get(kernel_id) for kernel_id in list(self._relinking)]
        results = await asyncio.gather(
            *(self._relink(kernel, deadline, grace) for kernel in kernels), return_exceptions=True
        )
        for kernel, result in zip(kernels, results, strict=True):
            if isinstance(result, Exception):
                log.error("kernel %s: re-linking failed", kernel.id, exc_info=result)
        self._kernels.persist()

    async def ready_for_clients(self, kernel_id: str, timeout: float) -> KernelRecord:
        """The kernel, once it can take a client: at once, unless `recover` is still
        re-linking it, then when that is done (or `timeout` seconds have passed). `NotFound`
        for an unknown kernel (or one shut down meanwhile)."""
        self.get(kernel_id)
        relinked = self._relinking.get(kernel_id)
        if relinked is not None:
            log.info("kernel %s: a client waits for its re-link", kernel_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(relinked.wait(), timeout)
        return self.get(kernel_id)

    async def _relink(self, kernel: KernelRecord, deadline: float, grace: float) -> None:
        gone: list[tuple[ReplicaRecord, str]] = []
        try:
            async with kernel.lifecycle:
                if not self._kernels.is_current(kernel):
                    return  # shut down meanwhile
                await self._hosts_back(kernel, deadline)
                for replica in kernel.live_replicas():
                    why = self._replica_gone(replica, grace)
                    if why is None:
                        self._launcher.subscribe(kernel, replica)
                    else:
                        replica.move_to(ReplicaState.DEAD)
                        gone.append((replica, why))
                if kernel.linkable_replicas():
                    try:
                        await self._linker.link(kernel)
                    except FleetError as e:
                        log.error("kernel %s could not be re-linked: %s", kernel.id, e)
                        kernel.execution_state = "dead"
                    else:
                        self._reserve_again(kernel)
                        log.info("kernel %s adopted from the previous gateway", kernel.id)
        finally:
            relinked = self._relinking.pop(kernel.id, None)
            if relinked is not None:
                relinked.set()
        for replica, why in gone:
            log.error(
                "kernel %s: replica %s on %s is known dead: %s", kernel.id, replica.id,
                replica.host_id, why,
            )  # fmt: skip
            self._groups.replica_died(kernel, replica, why)

    async def _hosts_back(self, kernel: KernelRecord, deadline: float) -> None:
        """Until every host of the kernel's live replicas has reported, or `deadline`."""
        wanted = {replica.host_id for replica in kernel.live_replicas()}
        while time.monotonic() < deadline:
            alive = {host.id for host in self._hosts.all() if host.alive}
            if wanted <= alive:
                return
            await asyncio.sleep(0.1)

    def _replica_gone(self, replica: ReplicaRecord, grace: float) -> str | None:
        """Why `replica` is known dead after a gateway restart, or None if its host runs it."""
        try:
            host = self._hosts.get(replica.host_id)
        except NotFound:
            host = None
        if host is None or not host.alive:
            return f"its host {replica.host_id} did not come back within {grace:.0f} s"
        listed = {model.get("id") for model in host.replicas if isinstance(model, dict)}
        if replica.id not in listed:
            return f"its host {replica.host_id} came back without it"
        return None

    def _reserve_again(self, kernel: KernelRecord) -> None:
        """Take a per-session kernel's GPUs again on its executor (see `recover`)."""
        if not (self._chooser.per_session and kernel.gpus):
            return
        executor = next((r for r in kernel.live_replicas() if r.id == kernel.executor), None)
        if executor is None:
            executor = kernel.live_replicas()[0]
        try:
            self._chooser.reserve(kernel, executor)
        except FleetError as e:
            log.error("kernel %s: its GPUs could not be taken again: %s", kernel.id, e)
        else:
            kernel.executor = executor.id

    # ---- replicated kernels ----------------------------------------------------------------

    async def migrate(self, kernel_id: str, replica_id: str, host_id: str | None) -> KernelRecord:
        """Move one replica to `host_id`, or where the policy places it (`GroupKeeper.migrate`)."""
        return await self._groups.migrate(kernel_id, replica_id, host_id)

    async def migrate_kernel(self, kernel_id: str, host_id: str | None) -> dict[str, Any]:
        """Move the kernel's executor replica (the one that ran its last cell, else its first)
        to `host_id`, or where the policy places it: ``POST /api/fleet/kernels/{id}/migrate``.

        A replica moves between cells. With none running or queued, the move is done before
        this returns ``{"state": "done", "replica_id": its successor, "from_host", "to_host"}``.
        Otherwise (as when a cell of the kernel asks for it: ``%fleet migrate``) it is checked,
        then started in the background, to happen once the running cell ends: ``{"state":
        "scheduled", "replica_id": None, "from_host", "to_host": host_id}``; its outcome shows
        as a ``replica-migrated`` event, or in the log.

        `NotFound` for an unknown kernel or host; `Conflict` for a kernel of one replica (it
        cannot move without losing its state), for the host the replica is on, or one already
        holding another of its replicas (and whatever `GroupKeeper.migrate` refuses)."""
        kernel = self.get(kernel_id)
        replica = next((r for r in kernel.replicas if r.id == kernel.executor), None)
        if replica is None and kernel.replicas:
            replica = kernel.replicas[0]
        if replica is None:
            raise KernelDead(f"kernel {kernel_id} has no replica to move")
        if host_id is not None:
            self._hosts.get(host_id)  # NotFound naming it
        if not kernel.replicated:
            raise Conflict(
                f"kernel {kernel_id} runs a single replica, which cannot move without losing "
                "its state"
            )
        if host_id == replica.host_id:
            raise Conflict(f"replica {replica.id} of kernel {kernel_id} is on {host_id} already")
        if host_id is not None and host_id in {r.host_id for r in kernel.replicas}:
            raise Conflict(f"kernel {kernel_id} has another replica on {host_id} already")
        moving = {"from_host": replica.host_id, "to_host": host_id}
        cells = kernel.link.cells if kernel.link is not None else None
        if cells is not None and (cells.current is not None or cells.queued):
            self._background.run(self._migrate_later(kernel_id, replica.id, host_id))
            return {"state": "scheduled", "replica_id": None, **moving}
        before = {r.id for r in kernel.replicas}
        await self._groups.migrate(kernel_id, replica.id, host_id)
        new = next(r for r in kernel.replicas if r.id not in before)
        return {"state": "done", "replica_id": new.id, **moving, "to_host": new.host_id}

    async def _migrate_later(self, kernel_id: str, replica_id: str, host_id: str | None) -> None:
        try:
            await self._groups.migrate(kernel_id, replica_id, host_id)
        except FleetError as e:
            log.warning("kernel %s: the move of %s asked for failed: %s", kernel_id, replica_id, e)

    def set_gpus(self, kernel_id: str, gpus: object) -> KernelRecord:
        """Set the kernel's GPU count for its later cells that ask for none themselves
        (``PUT /api/fleet/kernels/{id}/gpus``); its replicas' claims follow, and the count
        is stored with the kernel.

        `InvalidRequest` when `gpus` is not a non-negative int, or more than any host has (the
        message says the largest host's count); `Conflict` under a policy that binds a
        kernel's GPUs for its whole life (they were committed when it started)."""
        kernel = self.get(kernel_id)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise InvalidRequest(f"'gpus' must be a non-negative integer, not {gpus!r}")
        snapshot = self._fleet.snapshot()
        sized = snapshot.gpus_per_host > 0 or bool(snapshot.alive_hosts())  # else: unknown
        if sized and gpus > snapshot.host_size:
            raise InvalidRequest(
                f"kernel {kernel_id} cannot have {gpus} GPU(s) per cell: the largest host has "
                f"{snapshot.host_size}"
            )
        if self._chooser.per_session and gpus != kernel.gpus:
            raise Conflict(
                f"under the {self._policy.name} policy kernel {kernel_id} holds its "
                f"{kernel.gpus} GPU(s) for its whole life; restart it with KERNEL_GPUS instead"
            )
        kernel.gpus = gpus
        for replica in kernel.live_replicas():
            with contextlib.suppress(NotFound):  # its host is being forgotten: no claim to keep
                self._launcher.subscribe(kernel, replica)
        self._chooser.capacity_changed()
        self._kernels.persist()
        log.info("kernel %s: %d GPU(s) per cell from now on", kernel_id, gpus)
        return kernel

    async def drain_host(self, host_id: str) -> None:
        """Move every replica off `host_id` so it can be stopped (`GroupKeeper.drain_host`)."""
        await self._groups.drain_host(host_id)

    def check_drainable(self, host_id: str) -> int:
        """How many replicas a drain of `host_id` would move; raises as
        `GroupKeeper.check_drainable` does."""
        return len(self._groups.check_drainable(host_id))

    def reopen_host(self, host_id: str) -> bool:
        """A draining host takes work again (`GroupKeeper.reopen_host`)."""
        return self._groups.reopen_host(host_id)

    def replicas_on(self, host_id: str) -> int:
        """How many live replicas run on `host_id`."""
        return len(self._kernels.live_replicas_on(host_id))

    # ---- what the executor chooser asks (its `KernelOps`) ----------------------------------

    async def move_replica(self, kernel: KernelRecord, replica: ReplicaRecord, host: str) -> None:
        """Move `replica` to `host` for a cell of `kernel` (the policy's `Migrate`)."""
        await self._groups.move_replica(kernel, replica, host)

    async def release_memory(self, kernel_id: str, replica_id: str) -> None:
        """Ask a replica to move its GPU memory to the host (someone else's cell needs it)."""
        kernel = self.get(kernel_id)
        replica = next((r for r in kernel.replicas if r.id == replica_id), None)
        if replica is None or replica.dead:
            return  # gone: its memory went with it
        await self._launcher.release_memory(replica)

    # ---- internals -------------------------------------------------------------------------

    def _checked_env(self, env: Any) -> dict[str, str]:
        if env is None:
            return {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise InvalidRequest("'env' must map variable names to string values")
        return {k: v for k, v in env.items() if k.startswith("KERNEL_") or k in self._allowed_env}

    def _running_replica(self, kernel: KernelRecord) -> ReplicaRecord:
        """The replica running the kernel's cell, else its last executor, else a live one."""
        running = kernel.link.cells.current_assignment if kernel.link is not None else None
        for wanted in (running.replica_id if running else None, kernel.executor):
            for replica in kernel.replicas:
                if replica.id == wanted and not replica.dead:
                    return replica
        live = kernel.live_replicas()
        if not live:
            raise KernelDead(f"kernel {kernel.id} is dead: restart it or shut it down")
        return live[0]
