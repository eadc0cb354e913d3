"""``whole-hosts``: ``packing`` whose admission finds the first cell its GPUs (issue 17).

A session's kernel is admitted ``session_lead_s`` before its first cell (60 s in the simulator,
the time a kernel takes to start live), and a quarter of the June trace's cells are the first
of their kernel. Under ``notebookos`` and ``packing`` a new kernel's replicas go to the least
loaded hosts by replicas, whatever their free GPUs, so its first cell often finds none of its
three hosts with the GPUs it needs: it migrates a replica (10 s) or waits for a scale-out.
``whole-hosts`` places a kernel so that its first cell can run at once:

- its **first replica** goes to the host that can commit the kernel's GPUs now with the fewest
  idle GPUs left (best fit: whole hosts stay whole for 8-GPU kernels); the other replicas are
  placed as NotebookOS places them (fewest replicas, then most idle GPUs), within the cluster
  subscription ratio and the spot rule, as every replicated policy;
- when no host can commit them and none is being added, admission asks for a host
  (`ScaleOut`) and the kernel waits for it: the host's boot overlaps the kernel's start,
  instead of the first cell's critical path;
- a cell runs on its previous executor when that host can commit its GPUs (a 1-GPU cell no
  longer hops to a fuller host), else on the replica host that fits it best; a migration goes
  to the best-fitting host (``packing``'s rules).

Autoscaling is NotebookOS's rule with the `AutoscaleConfig` given, as for every built-in.
Pure, like every policy; ties are broken by host id.
"""

from __future__ import annotations

from kernelfleet.scheduler.decisions import AdmitDecision, Placement, ScaleOut
from kernelfleet.scheduler.hostkinds import choose_within_spot_limit
from kernelfleet.scheduler.packing import PackingPolicy
from kernelfleet.scheduler.policies import (
    accepts_replica,
    cluster_subscription_ratio,
    load_order,
    reject_too_large,
    spot_places,
)
from kernelfleet.scheduler.policy import PlacementRequest
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot, KernelSnapshot


class WholeHostsPolicy(PackingPolicy):
    """``packing`` with admission that gives the first cell a host with its GPUs free."""

    name = "whole-hosts"

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        """Replicas on `request.replicas` distinct hosts, the first able to run the kernel's
        first cell now (best fit); else a host more, or NotebookOS's placement while hosts
        are being added (the cell then migrates or waits as under ``packing``)."""
        rejected = reject_too_large(snapshot, request.gpus)
        if rejected is not None or request.gpus <= 0:
            return rejected or super().admit(snapshot, request)
        ratio = cluster_subscription_ratio(snapshot)
        accepting = [
            host
            for host in snapshot.alive_hosts()
            if host.gpus_total >= request.gpus and accepts_replica(host, request.gpus, ratio)
        ]
        ready = [host for host in accepting if host.can_commit(request.gpus)]
        spot = spot_places(self, request)
        for first in sorted(ready, key=_best_fit):
            others = sorted((h for h in accepting if h.id != first.id), key=load_order)
            chosen = choose_within_spot_limit([first, *others], request.replicas, spot)
            if len(chosen) >= request.replicas and chosen[0].id == first.id:
                return Placement(host_ids=tuple(host.id for host in chosen))
        if snapshot.gpus_per_host >= request.gpus and snapshot.hosts_pending == 0:
            return ScaleOut(1)
        return super().admit(snapshot, request)

    def pick_executor(
        self, able: list[HostSnapshot], kernel: KernelSnapshot, gpus: int = 1
    ) -> HostSnapshot:
        """The previous executor's host when it can commit the cell's GPUs, else the replica
        host that fits it best (``packing``)."""
        previous = next((host for host in able if host.id == kernel.executor_host), None)
        return previous or super().pick_executor(able, kernel, gpus)


def _best_fit(host: HostSnapshot) -> tuple[int, int, float, str]:
    return (host.gpus_idle, host.replicas, -host.free_speed(1), host.id)
