"""The built-in policies."""

from __future__ import annotations

from kernelfleet.errors import NoCapacity
from kernelfleet.scheduler.policy import Placement, PlacementRequest, Policy
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot


class NotebookOSPolicy(Policy):
    """Replicated kernels on oversubscribed hosts, GPUs bound only while a cell runs.

    Placement spreads replicas over distinct hosts, least loaded first: fewest replicas, then most
    idle GPUs, then host id (so equal hosts are chosen in a stable order).
    """

    name = "notebookos"

    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        alive = snapshot.alive_hosts()
        if not alive:
            raise NoCapacity("no host agent is alive: start one with 'kernelfleet host'")
        fitting = [host for host in alive if host.gpus_total >= request.gpus]
        if len(fitting) < request.replicas:
            largest = max(host.gpus_total for host in alive)
            raise NoCapacity(
                f"kernel {request.kernel_id} needs {request.replicas} host(s) with at least "
                f"{request.gpus} GPU(s) each; {len(fitting)} of {len(alive)} alive host(s) qualify "
                f"(the largest has {largest})"
            )
        chosen = sorted(fitting, key=_load_order)[: request.replicas]
        return Placement(host_ids=tuple(host.id for host in chosen))


def _load_order(host: HostSnapshot) -> tuple[int, int, str]:
    return (host.replicas, -host.gpus_idle, host.id)
