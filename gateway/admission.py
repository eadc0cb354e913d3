"""Where a kernel's replicas go: the policy's placement, waiting for capacity that can come.

`Admission` asks `Policy.admit` over the `FleetView`'s snapshot. A kernel waits here, up to the
launch timeout, with its GPUs counted as waiting demand, while hosts may still come: fewer
hosts have registered than it needs replicas (a gateway started beside its agents, or
restarted, answers before they register), or the policy waits for hosts the autoscaler can add
(or for capacity on a fleet that can grow). A request no host of the fleet can ever meet is
refused at once with `NeverFits`, a 4xx (a 503 would look worth retrying, and jupyter_server
retries it); a full fleet that cannot grow refuses with `NoCapacity` at once, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernelfleet.errors import InvalidRequest, NoCapacity
from kernelfleet.gateway.fleet_view import FleetView
from kernelfleet.gateway.records import KernelRecord
from kernelfleet.scheduler import (
    FleetSnapshot,
    Placement,
    PlacementRequest,
    Policy,
    Queue,
    Reject,
)
from kernelfleet.scheduler.decisions import AdmitDecision
from kernelfleet.scheduler.hostkinds import spot_hosts_barred, spot_replicas_allowed

log = logging.getLogger("kernelfleet.gateway.kernels")

ADMISSION_RECHECK = 0.5
"""Seconds between asking the policy again for a kernel waiting to be placed."""

START_HOSTS = "start them with 'kernelfleet host'"
START_CONTAINER_HOSTS = (
    "start more with 'kernelfleet host --container-engine URL', or see to the engines of the "
    "others (GET /api/fleet/hosts shows each host's 'containers')"
)


class NeverFits(InvalidRequest):
    """A kernel request no host of this fleet can ever meet, however long it waits."""

    reason = "never-fits"


class Admission:
    """Places kernels and single replicas with the policy; see the module docstring."""

    def __init__(self, policy: Policy, fleet: FleetView, launch_timeout: float) -> None:
        self._policy = policy
        self._fleet = fleet
        self._launch_timeout = launch_timeout
        self.max_hosts = 0
        """Most hosts the fleet can ever have (the autoscaler's limit); 0: not known."""

    async def admit(self, kernel: KernelRecord) -> Placement:
        """Where the policy places a new kernel; waits (see the module docstring) up to the
        launch timeout, then `NoCapacity` saying what it waited for. `NeverFits` at once for
        a request the fleet can never meet; `NoCapacity` at once when the fleet has the hosts
        but not the room, and cannot grow."""
        request = self._request(kernel)
        deadline = time.monotonic() + self._launch_timeout
        said = ""
        try:
            while True:
                snapshot = self._fleet.snapshot(kernel.launch_name)
                decision = self._policy.admit(snapshot, request)
                if isinstance(decision, Placement):
                    if said:
                        log.info("kernel %s: placed after waiting", kernel.id)
                    return decision
                self._check_fits(kernel, decision)
                grows = snapshot.gpus_per_host > 0 or snapshot.hosts_pending > 0
                if not grows and not self._hosts_short(snapshot, request):
                    return self._policy.place(snapshot, request)  # raises NoCapacity: why
                why = self._waiting_for(snapshot, request, decision, kernel.launch_name)
                if why != said:
                    log.info("kernel %s waits: %s", kernel.id, why)
                    said = why
                if time.monotonic() > deadline:
                    raise NoCapacity(
                        f"kernel {kernel.id}: no host could take it within "
                        f"{self._launch_timeout:.0f} s ({why})"
                    )
                self._fleet.admitting(kernel.id, kernel.gpus)
                await asyncio.sleep(ADMISSION_RECHECK)
        finally:
            self._fleet.admitted(kernel.id)

    def _check_fits(self, kernel: KernelRecord, decision: AdmitDecision) -> None:
        """`NeverFits` if the policy rejects the kernel (waiting would not help), or its
        replicas need more distinct hosts than the fleet can ever have."""
        if isinstance(decision, Reject):
            detail = f": {decision.detail}" if decision.detail else ""
            raise NeverFits(
                f"kernel {kernel.id} can never start on this fleet ({decision.reason.value}"
                f"{detail}); ask for fewer GPUs (KERNEL_GPUS, or a smaller GPU kernelspec)"
            )
        if self.max_hosts and kernel.replicas_wanted > self.max_hosts:
            raise NeverFits(
                f"kernel {kernel.id} can never start on this fleet: its "
                f"{kernel.replicas_wanted} replicas need as many distinct hosts, and the fleet "
                f"has at most {self.max_hosts} (its max_hosts); give the gateway fewer "
                "--replicas or more --max-hosts"
            )

    @staticmethod
    def _hosts_short(snapshot: FleetSnapshot, request: PlacementRequest) -> bool:
        """Whether fewer hosts are alive than the request has replicas: more may register."""
        return len(snapshot.alive_hosts()) < max(request.replicas, 1)

    def _waiting_for(
        self,
        snapshot: FleetSnapshot,
        request: PlacementRequest,
        decision: AdmitDecision,
        launch_name: str,
    ) -> str:
        """What the kernel waits for, as a user should read it."""
        alive, wanted = len(snapshot.alive_hosts()), max(request.replicas, 1)
        if self._fleet.in_containers(launch_name) and alive < wanted:
            everyone = len(self._fleet.snapshot().alive_hosts())
            if everyone > alive:
                return (
                    f"it runs in containers ({launch_name}) and needs {wanted} host(s) that "
                    f"reach a container engine; {alive} of the {everyone} live host(s) do: "
                    f"{START_CONTAINER_HOSTS}"
                )
        if alive == 0 and snapshot.hosts_pending == 0:
            return f"no host agent is alive yet: {START_HOSTS}"
        if alive < wanted:
            return (
                f"it needs {wanted} host(s) and {alive} are alive"
                + (f", {snapshot.hosts_pending} being added" if snapshot.hosts_pending else "")
                + (f": {START_HOSTS}" if not snapshot.hosts_pending else "")
            )
        if isinstance(decision, Queue):
            return decision.reason.value + (f": {decision.detail}" if decision.detail else "")
        return "hosts are being added"

    def place(self, kernel: KernelRecord) -> Placement:
        """Where the policy places the kernel's replicas now (a restart): `NoCapacity` if
        nowhere."""
        return self._policy.place(self._fleet.snapshot(kernel.launch_name), self._request(kernel))

    def place_replica(self, kernel: KernelRecord, avoiding: set[str]) -> str:
        """The host for one new replica of `kernel`, among those not in `avoiding` (the hosts
        of its other replicas); `NoCapacity` if none will do."""
        whole = self._fleet.snapshot(kernel.launch_name)
        spot = spot_replicas_allowed(kernel.replicas_wanted, self._policy.max_spot_replicas)
        # of the kernel's other places (all but this one), those with no replica count too
        others = kernel.replicas_wanted - 1
        barred = spot_hosts_barred(whole, sorted(avoiding), None, spot, wanted=others)
        request = PlacementRequest(kernel.id, gpus=kernel.gpus, spot_places=0 if barred else 1)
        if not whole.alive_hosts() and self._fleet.in_containers(kernel.launch_name):
            raise NoCapacity(
                f"no live host can run a replica of kernel {kernel.id}: it runs in containers "
                f"({kernel.launch_name}) and no host reaches a container engine; "
                f"{START_CONTAINER_HOSTS}"
            )
        snapshot = self._fleet.snapshot_without(avoiding, kernel.launch_name)
        if not snapshot.alive_hosts() and whole.alive_hosts():
            raise NoCapacity(
                f"every live host holds a replica of kernel {kernel.id} already "
                f"({', '.join(sorted(avoiding))}): a new one waits for another host"
            )
        return self._policy.place(snapshot, request).host_ids[0]

    @staticmethod
    def _request(kernel: KernelRecord) -> PlacementRequest:
        return PlacementRequest(kernel.id, replicas=kernel.replicas_wanted, gpus=kernel.gpus)
