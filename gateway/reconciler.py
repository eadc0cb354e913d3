"""Reconciling the gateway's replicas with what their hosts report.

`HostReconciler` is the host registry's `HostListener`. A host's report updates its replicas'
records: one whose process exited, or that an agent restarted without, is dead. A host that
went silent takes its replicas with it: they are given up for dead (and replaced, if their
kernel replicates). If such a host comes back still running one of them, that replica is
stopped: its kernel has moved on without it, and its GPUs went back to the pool.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kernelfleet.errors import FleetError
from kernelfleet.gateway.background import Background
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus, publish_binding
from kernelfleet.gateway.gpu_speeds import speed_bases
from kernelfleet.gateway.hosts import HostRecord
from kernelfleet.gateway.kernel_table import KernelTable
from kernelfleet.gateway.launcher import CapacityListener
from kernelfleet.gateway.ledger import GpuLedger, device_ids_of
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord, ReplicaState

log = logging.getLogger("kernelfleet.gateway.kernels")

_RUNNING = (ReplicaState.STARTING.value, ReplicaState.READY.value)
"""Reported states of a replica that still runs (and so holds its host's resources)."""


class ReplicaLoss(Protocol):
    """Who handles a replica that died (the `GroupKeeper`)."""

    def replicas_died(self, deaths: list[tuple[KernelRecord, ReplicaRecord, str]]) -> None:
        """Each (kernel, replica, why) of `deaths`: the replica is ``dead`` now, for `why`."""


class HostReconciler:
    """Applies host reports and losses to the kernels' replicas; see the module docstring."""

    def __init__(
        self,
        kernels: KernelTable,
        ledger: GpuLedger,
        capacity: CapacityListener,
        loss: ReplicaLoss,
        background: Background,
        events: EventBus | None = None,
    ) -> None:
        self._events = events or EventBus()
        self._kernels = kernels
        self._ledger = ledger
        self._capacity = capacity
        self._loss = loss
        self._background = background
        self._given_up: set[str] = set()
        """Replicas declared dead because their host went silent; stopped if it comes back."""

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        """Apply a host's report. After an agent restart, replicas it does not list are dead."""
        self._stop_given_up(host)
        vanished = self._ledger.set_host(
            host.id, device_ids_of(host.gpus), speed_bases(host.gpus, host.gpu_type)
        )
        if vanished:
            log.error("host %s no longer reports GPU(s) %s", host.id, ", ".join(vanished))
        self._capacity.capacity_changed()
        reported = {model.get("id"): model for model in host.replicas if isinstance(model, dict)}
        deaths = []
        for kernel, replica in self._kernels.live_replicas_on(host.id):
            model = reported.get(replica.id)
            if model is not None:
                replica.update(model)
                if replica.dead:
                    why = f"its process exited ({model.get('exit_code')})"
                    if model.get("exit_reason"):  # a container's: its memory limit, say
                        why = f"{why}: {model['exit_reason']}"
                    deaths.append((kernel, replica, why))
            elif restarted:
                replica.move_to(ReplicaState.DEAD)
                deaths.append((kernel, replica, f"the agent on {host.id} restarted"))
        self._loss.replicas_died(deaths)

    def on_host_lost(self, host: HostRecord) -> None:
        """`host` is lost (or forgotten): its GPUs leave the ledger and its replicas are given
        up for dead."""
        publish_binding(self._events, EventType.GPUS_RELEASED, self._ledger.drop_host(host.id))
        self._capacity.capacity_changed()
        why = f"host {host.id} was lost: {host.lost_why or 'it stopped answering'}"
        deaths = []
        for kernel, replica in self._kernels.live_replicas_on(host.id):
            replica.move_to(ReplicaState.DEAD)
            self._given_up.add(replica.id)
            deaths.append((kernel, replica, why))
        self._loss.replicas_died(deaths)

    def _stop_given_up(self, host: HostRecord) -> None:
        """A host that was lost and came back may still run replicas given up for dead (they
        were replaced, and their GPUs went back to the pool): stop them. A restarted agent
        may report some too: process replicas die with their agent, but containers outlive
        it and the new agent adopts them (docs/containers.md)."""
        for model in host.replicas:
            replica_id = model.get("id") if isinstance(model, dict) else None
            if replica_id in self._given_up and model.get("state") in _RUNNING:
                self._given_up.discard(replica_id)
                log.warning("host %s still runs replica %s, given up for dead: stopping it",
                            host.id, replica_id)  # fmt: skip
                self._background.run(self._stop_stray(host, replica_id))

    async def _stop_stray(self, host: HostRecord, replica_id: str) -> None:
        try:
            await host.client.stop_replica(replica_id)
        except FleetError as e:
            log.error("could not stop replica %s on %s: %s", replica_id, host.id, e)
