"""Where a kernel's replicas go: the policy's placement, waiting for capacity that can come.

`Admission` asks `Policy.admit` over the `FleetView`'s snapshot; while the policy would wait
for hosts the autoscaler can add (or for capacity on a fleet that can grow), the kernel waits
here, up to the launch timeout, with its GPUs counted as waiting demand.
"""

from __future__ import annotations

import asyncio
import time

from kernelfleet.errors import NoCapacity
from kernelfleet.gateway.fleet_view import FleetView
from kernelfleet.gateway.records import KernelRecord
from kernelfleet.scheduler import Placement, PlacementRequest, Policy, Queue, Reject

ADMISSION_RECHECK = 0.5
"""Seconds between asking the policy again for a kernel waiting to be placed."""


class Admission:
    """Places kernels and single replicas with the policy; see the module docstring."""

    def __init__(self, policy: Policy, fleet: FleetView, launch_timeout: float) -> None:
        self._policy = policy
        self._fleet = fleet
        self._launch_timeout = launch_timeout

    async def admit(self, kernel: KernelRecord) -> Placement:
        """Where the policy places a new kernel. While it asks for hosts the autoscaler can add
        (or waits for capacity on a fleet that can grow), wait, up to the launch timeout,
        with the kernel's GPUs counted as waiting demand; then `NoCapacity` saying why."""
        request = self._request(kernel)
        deadline = time.monotonic() + self._launch_timeout
        try:
            while True:
                snapshot = self._fleet.snapshot()
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
                self._fleet.admitting(kernel.id, kernel.gpus)
                await asyncio.sleep(ADMISSION_RECHECK)
        finally:
            self._fleet.admitted(kernel.id)

    def place(self, kernel: KernelRecord) -> Placement:
        """Where the policy places the kernel's replicas now (a restart): `NoCapacity` if
        nowhere."""
        return self._policy.place(self._fleet.snapshot(), self._request(kernel))

    def place_replica(self, kernel: KernelRecord, avoiding: set[str]) -> str:
        """The host for one new replica of `kernel`, among those not in `avoiding` (the hosts
        of its other replicas); `NoCapacity` if none will do."""
        request = PlacementRequest(kernel.id, gpus=kernel.gpus)
        snapshot = self._fleet.snapshot_without(avoiding)
        if not snapshot.alive_hosts() and self._fleet.snapshot().alive_hosts():
            raise NoCapacity(
                f"every live host holds a replica of kernel {kernel.id} already "
                f"({', '.join(sorted(avoiding))}): a new one waits for another host"
            )
        return self._policy.place(snapshot, request).host_ids[0]

    @staticmethod
    def _request(kernel: KernelRecord) -> PlacementRequest:
        return PlacementRequest(kernel.id, replicas=kernel.replicas_wanted, gpus=kernel.gpus)
