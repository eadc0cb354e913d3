"""Replica processes: started, restarted and stopped through their hosts' agents.

`ReplicaLauncher` is the only code that asks host agents to start, restart or stop a
replica. Each replica it starts claims its kernel's GPU need in the ledger on its host (and a
stopped one gives it back), and is given its kernel's token (`KernelTokens`); `launch_group`
starts a kernel's replicas together, joins them into one Raft group if the kernel replicates,
and links the kernel to them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Protocol

import zmq.asyncio

from kernelfleet.errors import FleetError, HostUnavailable, KernelStartFailed, NotFound
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus, publish_binding
from kernelfleet.gateway.gpu_speeds import speed_bases
from kernelfleet.gateway.hosts import HostRegistry
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.gateway.ledger import GpuLedger, device_ids_of
from kernelfleet.gateway.links import KernelLinker
from kernelfleet.gateway.records import (
    KernelRecord,
    ReplicaRecord,
    ReplicaState,
    ReplicationSettings,
)
from kernelfleet.gateway.replication import Member, join_group, new_group_password, send_request
from kernelfleet.protocol import ConnectionInfo, Request

log = logging.getLogger("kernelfleet.gateway.kernels")


class CapacityListener(Protocol):
    """Who must hear that GPUs were released or hosts changed (the `ExecutorChooser`, whose
    waiting cells then ask the policy again)."""

    def capacity_changed(self) -> None: ...


class ReplicaLauncher:
    """Starts, restarts and stops replicas; see the module docstring."""

    def __init__(
        self,
        hosts: HostRegistry,
        ledger: GpuLedger,
        capacity: CapacityListener,
        linker: KernelLinker,
        context: zmq.asyncio.Context,
        replication: ReplicationSettings,
        launch_timeout: float,
        tokens: KernelTokens | None = None,
        events: EventBus | None = None,
    ) -> None:
        self._events = events or EventBus()
        self._hosts = hosts
        self._ledger = ledger
        self._capacity = capacity
        self._linker = linker
        self._context = context
        self._replication = replication
        self._launch_timeout = launch_timeout
        self._tokens = tokens
        self._arriving: Counter[str] = Counter()
        """Replicas being started, by host (not in the ledger yet)."""

    def arriving(self, host_id: str) -> int:
        """How many replicas are being started on `host_id` now."""
        return self._arriving[host_id]

    async def launch(
        self, kernel: KernelRecord, host_id: str, *, joining: bool = False
    ) -> ReplicaRecord:
        """Start one replica of `kernel` on `host_id` and subscribe its GPUs there.

        `joining`: it joins the kernel's running group, so it is ``catching-up`` (whatever its
        host says) until the caller marks it ready."""
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
                kernel_token=self._tokens.issue(kernel.id) if self._tokens else None,
            )
        finally:
            self._arriving[host_id] -= 1
        replica = ReplicaRecord(
            id=replica_id,
            host_id=host_id,
            connection=ConnectionInfo.from_dict(model["connection"]),
            raft_address=model.get("raft_address"),
            state=ReplicaState.CATCHING_UP if joining else ReplicaState.STARTING,
        )
        replica.update(model)
        self.subscribe(kernel, replica)
        return replica

    async def launch_group(self, kernel: KernelRecord, host_ids: tuple[str, ...]) -> None:
        """Launch one replica per host, join them to a new Raft group if replicated, and link.

        On failure every replica launched is stopped again and the error propagates.
        """
        try:
            results = await asyncio.gather(
                *(self.launch(kernel, host_id) for host_id in host_ids),
                return_exceptions=True,
            )
            kernel.replicas = [r for r in results if isinstance(r, ReplicaRecord)]
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            if kernel.replicated:
                await self._form_group(kernel)
            await self._linker.link(kernel)
        except BaseException:
            await self.stop(kernel, kernel.replicas)
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

    async def restart(self, kernel: KernelRecord, replica: ReplicaRecord) -> ReplicaRecord | None:
        """Restart `replica` in place with an empty namespace; None if that cannot be done
        (its host is lost, or its agent no longer knows it: the caller replaces it)."""
        host = self._hosts.get(replica.host_id)
        if not host.alive:
            return None
        try:
            model = await host.client.restart_replica(
                replica.id, launch_timeout=self._launch_timeout
            )
        except NotFound:
            log.warning("kernel %s: host %s forgot replica %s", kernel.id, host.id, replica.id)
            return None
        replica.update(model)
        replica.connection = ConnectionInfo.from_dict(model["connection"])
        self.subscribe(kernel, replica)
        return replica

    async def stop(
        self,
        kernel: KernelRecord,
        replicas: list[ReplicaRecord],
        *,
        release_after_stop: bool = False,
    ) -> None:
        """Stop each replica on its host (if it still heartbeats) and give its GPUs back:
        before the stop by default; with `release_after_stop`, each replica's once its host
        answered that its process is gone (or could not stop it: lost, or it forgot it), so
        that no other cell is given a GPU that a stopping process may still use. Failures are
        logged, never raised."""
        if not release_after_stop:
            for replica in replicas:
                self.unsubscribe(kernel, replica)

        async def stop(replica: ReplicaRecord) -> None:
            try:
                host = self._hosts.get(replica.host_id)
                if host.alive:
                    await host.client.stop_replica(replica.id)
            except (NotFound, HostUnavailable) as e:
                log.warning("kernel %s: could not stop replica %s: %s", kernel.id, replica.id, e)
            except FleetError as e:
                log.error("kernel %s: stopping replica %s failed: %s", kernel.id, replica.id, e)
            finally:
                if release_after_stop:
                    self.unsubscribe(kernel, replica)

        await asyncio.gather(*(stop(replica) for replica in replicas))

    def subscribe(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        """The replica claims its kernel's GPU need on its host (which the ledger learns of)."""
        if replica.host_id not in self._ledger.hosts():
            host = self._hosts.get(replica.host_id)
            self._ledger.set_host(
                host.id, device_ids_of(host.gpus), speed_bases(host.gpus, host.gpu_type)
            )
        self._ledger.subscribe(replica.host_id, kernel.id, replica.id, kernel.gpus)

    def unsubscribe(self, kernel: KernelRecord, replica: ReplicaRecord) -> None:
        """The replica is gone (or going): its GPU claim and any binding go back to the pool."""
        binding = self._ledger.unsubscribe(kernel.id, replica.id)
        if binding is not None:
            publish_binding(self._events, EventType.GPUS_RELEASED, (binding,))
        self._capacity.capacity_changed()

    async def release_memory(self, replica: ReplicaRecord) -> None:
        """Ask a replica to move its GPU memory to the host (someone else's cell needs it)."""
        await send_request(
            self._context, replica.connection, Request.RELEASE, {},
            self._replication.join_timeout, f"replica {replica.id} releasing its GPUs",
        )  # fmt: skip
