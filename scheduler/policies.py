"""The built-in policies: ``notebookos``, ``reservation`` and ``fcfs-batch``.

Each is pure: decisions are functions of the snapshot and the request (docs/notebookos.md for the
NotebookOS formulas). Among hosts equal by a policy's own rule, the one whose free GPUs are
faster (`HostSnapshot.free_speed`: per-GPU speeds from the fleet's fingerprints) is preferred;
remaining ties are broken by host id so equal inputs give equal answers.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernelfleet.errors import NoCapacity
from kernelfleet.scheduler.autoscale import AutoscaleConfig, autoscale
from kernelfleet.scheduler.decisions import (
    AdmitDecision,
    AutoscaleDecision,
    ExecutorDecision,
    Migrate,
    Placement,
    Queue,
    QueueReason,
    Reject,
    RejectReason,
    RunOn,
    ScaleOut,
)
from kernelfleet.scheduler.hostkinds import (
    ON_DEMAND,
    SPOT,
    choose_within_spot_limit,
    spot_hosts_barred,
    spot_replicas_allowed,
)
from kernelfleet.scheduler.policy import (
    ExecuteRequest,
    GpuBinding,
    PlacementRequest,
    Policy,
    StateSync,
)
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot, KernelSnapshot

SUBSCRIPTION_RATIO_CAP = 7.0


class AutoscalingPolicy(Policy):
    """Shared by the built-ins: the NotebookOS autoscaling formula with `AutoscaleConfig`."""

    def __init__(self, autoscaling: AutoscaleConfig | None = None) -> None:
        self.autoscaling = autoscaling or AutoscaleConfig()

    def autoscale(self, snapshot: FleetSnapshot) -> AutoscaleDecision:
        return autoscale(snapshot, self.autoscaling)

    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        """`admit`, for callers that cannot wait: anything but a placement is `NoCapacity`."""
        decision = self.admit(snapshot, request)
        if isinstance(decision, Placement):
            return decision
        raise NoCapacity(f"kernel {request.kernel_id}: {_explain(decision)}")


class NotebookOSPolicy(AutoscalingPolicy):
    """Replicated kernels on oversubscribed hosts, GPUs bound only while a cell runs.

    Placement spreads replicas over distinct hosts, least loaded first: fewest replicas, then most
    idle GPUs, then host id. A host is refused a replica if its subscription ratio after placement
    would exceed the cluster's (`cluster_subscription_ratio`). A majority of a kernel's replicas
    stay on on-demand hosts (`hostkinds`): spot hosts beyond its share are passed over, here and
    in migrations.
    """

    name = "notebookos"
    replicas = 3
    binding = GpuBinding.PER_CELL
    state_sync = StateSync.OFF_CRITICAL_PATH

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        alive = snapshot.alive_hosts()
        if not alive and snapshot.hosts_pending == 0 and snapshot.gpus_per_host <= 0:
            return Queue(
                QueueReason.WAITING_FOR_HOSTS,
                "no host agent is alive: start one with 'kernelfleet host'",
            )
        too_large = reject_too_large(snapshot, request.gpus)
        if too_large is not None:
            return too_large
        fitting = [host for host in alive if host.gpus_total >= request.gpus]
        ratio = cluster_subscription_ratio(snapshot)
        spot = spot_places(self, request)
        accepting = [host for host in fitting if accepts_replica(host, request.gpus, ratio)]
        allowed = choose_within_spot_limit(
            sorted(accepting, key=load_order), request.replicas, spot
        )
        if len(allowed) >= request.replicas:
            return Placement(host_ids=tuple(host.id for host in allowed))
        grows = snapshot.gpus_per_host > 0 or snapshot.hosts_pending > 0
        anywhere = choose_within_spot_limit(sorted(fitting, key=load_order), request.replicas, spot)
        if not grows and len(anywhere) >= request.replicas:
            # No host will be added: the ratio, whose job is to ask for more hosts, cannot,
            # so it does not bind; the least loaded hosts take the replicas (a kernelfleet
            # addition: NotebookOS always autoscales).
            return Placement(host_ids=tuple(host.id for host in anywhere))
        missing = request.replicas - len(allowed) - snapshot.hosts_pending
        detail = (
            f"needs {request.replicas} host(s) with at least {request.gpus} GPU(s) each; "
            f"{len(fitting)} of {len(alive)} alive host(s) are large enough and {len(allowed)} "
            f"within the cluster subscription ratio {ratio:.2f}"
        )
        spot_hosts = sum(1 for host in fitting if host.kind == SPOT)
        if spot_hosts:
            detail += (
                f"; at most {spot} of its replicas may be on spot hosts (a majority stays "
                f"on-demand), and {len(fitting) - spot_hosts} large enough host(s) are on-demand"
            )
        if snapshot.gpus_per_host > 0 and missing > 0:
            # every host missing must be on-demand when that is all the majority lacks
            on_demand = sum(1 for host in accepting if host.kind != SPOT)
            needed = request.replicas - spot - on_demand
            return ScaleOut(missing, ON_DEMAND if needed >= missing else None)
        reason = QueueReason.SUBSCRIPTION_FULL if fitting else QueueReason.WAITING_FOR_HOSTS
        return Queue(reason, detail)

    def choose_executor(self, snapshot: FleetSnapshot, request: ExecuteRequest) -> ExecutorDecision:
        """A replica host that can commit the GPUs (`pick_executor` says which); else migrate
        the replica on the busiest host to `migration_target_for`; else scale out (or wait for
        hosts already being added)."""
        kernel = request.kernel
        if not kernel.replica_hosts:
            return Reject(RejectReason.NO_REPLICAS, f"kernel {kernel.id} has no replica")
        too_large = reject_too_large(snapshot, request.gpus)
        if too_large is not None:
            return too_large
        replicas = _hosts(snapshot, kernel.replica_hosts)
        able = [host for host in replicas if host.can_commit(request.gpus)]
        if able:
            return RunOn(self.pick_executor(able, kernel, request.gpus).id)
        source = _migration_source(replicas, kernel.replica_hosts, kernel.executor_host)
        spot = spot_replicas_allowed(self.replicas, self.max_spot_replicas)
        barred = spot_hosts_barred(
            snapshot, kernel.replica_hosts, source, spot, kernel.catching_up, self.replicas
        )
        exclude = (*kernel.replica_hosts, *sorted(barred))
        target = self.migration_target_for(snapshot, request.gpus, exclude)
        if target is not None:
            return Migrate(from_host=source, to_host=target.id)
        return _grow_or_wait(snapshot, request.gpus, ON_DEMAND if barred else None)

    def pick_executor(
        self, able: list[HostSnapshot], kernel: KernelSnapshot, gpus: int = 1
    ) -> HostSnapshot:
        """Among replica hosts that can commit the cell's `gpus` GPUs: the previous executor's,
        else the one with the most idle GPUs, then the fastest free GPUs, then by id."""
        previous = next((host for host in able if host.id == kernel.executor_host), None)
        return previous or min(able, key=lambda h: (-h.gpus_idle, -h.free_speed(gpus), h.id))

    def migration_target_for(
        self, snapshot: FleetSnapshot, gpus: int, exclude: tuple[str, ...]
    ) -> HostSnapshot | None:
        return migration_target(snapshot, gpus, exclude)


class ReservationPolicy(AutoscalingPolicy):
    """The JupyterHub/Colab way: a session commits its GPUs on one host for its whole life.

    Admission picks the alive host with the fewest idle GPUs that still fit (best fit, then id);
    never a spot host, under the majority rule (one replica: a revocation would lose it).
    """

    name = "reservation"
    replicas = 1
    binding = GpuBinding.PER_SESSION
    state_sync = StateSync.OFF_CRITICAL_PATH

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        too_large = reject_too_large(snapshot, request.gpus)
        if too_large is not None:
            return too_large
        fits = [host for host in snapshot.alive_hosts() if host.can_commit(request.gpus)]
        if len(fits) >= request.replicas:
            ordered = sorted(fits, key=lambda h: (h.gpus_idle, -h.free_speed(request.gpus), h.id))
            spot = spot_places(self, request)
            chosen = choose_within_spot_limit(ordered, request.replicas, spot)
            if len(chosen) >= request.replicas:
                return Placement(tuple(host.id for host in chosen))
            return _grow_or_wait(snapshot, request.gpus, ON_DEMAND)
        return _grow_or_wait(snapshot, request.gpus)

    def choose_executor(self, snapshot: FleetSnapshot, request: ExecuteRequest) -> ExecutorDecision:
        """The kernel's own host: its GPUs are already committed to it."""
        kernel = request.kernel
        if not kernel.replica_hosts:
            return Reject(RejectReason.NO_REPLICAS, f"kernel {kernel.id} has no replica")
        return RunOn(kernel.executor_host or kernel.replica_hosts[0])


class FcfsBatchPolicy(AutoscalingPolicy):
    """A fresh container per cell, first come first served: the cell's GPUs and its container
    are taken on the best-fitting host, state is loaded before and saved after on the critical
    path. Between cells a kernel holds nothing."""

    name = "fcfs-batch"
    replicas = 0
    binding = GpuBinding.PER_CELL
    state_sync = StateSync.ON_CRITICAL_PATH

    def place(self, snapshot: FleetSnapshot, request: PlacementRequest) -> Placement:
        """For the gateway, which needs somewhere to start the kernel: least loaded hosts."""
        spot = spot_places(self, request)
        alive = snapshot.alive_hosts()
        chosen = choose_within_spot_limit(sorted(alive, key=load_order), request.replicas, spot)
        if len(chosen) < request.replicas:
            raise NoCapacity(
                f"kernel {request.kernel_id} needs {request.replicas} host(s), a majority of them "
                f"on-demand; {len(alive)} alive"
            )
        return Placement(tuple(host.id for host in chosen))

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        """Nothing is held between cells, so admission takes no host."""
        return reject_too_large(snapshot, request.gpus) or Placement(())

    def choose_executor(self, snapshot: FleetSnapshot, request: ExecuteRequest) -> ExecutorDecision:
        too_large = reject_too_large(snapshot, request.gpus)
        if too_large is not None:
            return too_large
        fits = [host for host in snapshot.alive_hosts() if host.can_commit(request.gpus)]
        if fits:
            return RunOn(
                min(fits, key=lambda h: (h.gpus_idle, -h.free_speed(request.gpus), h.id)).id
            )
        return _grow_or_wait(snapshot, request.gpus)


def spot_places(policy: Policy, request: PlacementRequest) -> int:
    """How many of the hosts `request` asks for may be spot hosts."""
    if request.spot_places is not None:
        return request.spot_places
    return spot_replicas_allowed(request.replicas, policy.max_spot_replicas)


def cluster_subscription_ratio(snapshot: FleetSnapshot) -> float:
    """Demand GPUs / busy GPUs over the caller's window, within [1, 7]; 7 when nothing is busy."""
    if snapshot.busy_gpus <= 0:
        return SUBSCRIPTION_RATIO_CAP
    return min(SUBSCRIPTION_RATIO_CAP, max(1.0, snapshot.demand_gpus / snapshot.busy_gpus))


def migration_target(
    snapshot: FleetSnapshot, gpus: int, exclude: Iterable[str] = ()
) -> HostSnapshot | None:
    """The least loaded alive host, not in `exclude`, that can commit `gpus` now: fewest
    committed GPUs, then lowest subscription, then fewest replicas, then the fastest free GPUs,
    then id."""
    excluded = set(exclude)
    able = [h for h in snapshot.alive_hosts() if h.id not in excluded and h.can_commit(gpus)]
    if not able:
        return None
    return min(
        able,
        key=lambda h: (
            h.gpus_committed,
            h.subscription_ratio(),
            h.replicas,
            -h.free_speed(gpus),
            h.id,
        ),
    )


def accepts_replica(host: HostSnapshot, gpus: int, ratio: float) -> bool:
    """The host-refusal rule: subscription after placement must not exceed the cluster ratio."""
    return gpus == 0 or host.subscription_ratio(gpus) <= ratio


def _migration_source(
    replicas: list[HostSnapshot], replica_hosts: tuple[str, ...], executor: str | None
) -> str:
    """The replica to move: on the busiest host (fewest idle GPUs), not the previous executor
    when there is a choice (its state is warmest), then by host id. A replica whose host is
    gone from the snapshot is moved first."""
    known = {host.id for host in replicas}
    lost = sorted(host_id for host_id in replica_hosts if host_id not in known)
    if lost:
        return lost[0]
    return min(replicas, key=lambda h: (h.gpus_idle, h.id == executor, h.id)).id


def _grow_or_wait(snapshot: FleetSnapshot, gpus: int, kind: str | None = None) -> ScaleOut | Queue:
    """A host more (of `kind`, if it must be), or wait for those being added."""
    if snapshot.hosts_pending > 0 or snapshot.gpus_per_host <= 0:
        return Queue(QueueReason.WAITING_FOR_GPUS, f"waiting for {gpus} GPU(s)")
    return ScaleOut(1, kind)


def reject_too_large(snapshot: FleetSnapshot, gpus: int) -> Reject | None:
    size = snapshot.host_size
    known = snapshot.gpus_per_host > 0 or bool(snapshot.alive_hosts())
    if known and gpus > size:
        return Reject(
            RejectReason.LARGER_THAN_ANY_HOST,
            f"needs {gpus} GPU(s) on one host; the largest has {size}",
        )
    return None


def _hosts(snapshot: FleetSnapshot, host_ids: Iterable[str]) -> list[HostSnapshot]:
    found = (snapshot.host(host_id) for host_id in host_ids)
    return [host for host in found if host is not None and host.alive]


def _explain(decision: AdmitDecision) -> str:
    if isinstance(decision, Queue | Reject):
        return f"{decision.reason.value}" + (f" ({decision.detail})" if decision.detail else "")
    if isinstance(decision, ScaleOut):
        return f"needs {decision.hosts} more host(s)"
    return "placed"


def load_order(host: HostSnapshot) -> tuple[int, int, str]:
    return (host.replicas, -host.gpus_idle, host.id)


BUILTIN_POLICIES: dict[str, type[Policy]] = {
    policy.name: policy for policy in (NotebookOSPolicy, ReservationPolicy, FcfsBatchPolicy)
}
