"""``packing``: NotebookOS's replicated, per-cell design with best-fit GPU packing (ours).

NotebookOS spreads cells: a cell runs on its previous executor, else on the replica host with
the *most* idle GPUs, and a migration goes to the *least* loaded host. Spreading leaves a
little free on every host, so an 8-GPU cell often fits nowhere (a scale-out on its critical
path) and no host is ever fully idle to be released. ``packing`` does the opposite:

- a cell runs on the replica host with the *fewest* idle GPUs that still fit it (its previous
  executor on a tie), so whole hosts stay free for large cells and for scale-in;
- a migration goes to the host with the fewest idle GPUs that fit (then fewest replicas).

Placement, admission and the autoscaler are NotebookOS's, with the `AutoscaleConfig` given
(buffer host included): the two policies differ only in the choices above, so measured side
by side under one config the difference is theirs. Packing keeps free capacity in whole hosts,
which makes running without a buffer host (``buffer_hosts=0``) cheaper in start delay than
for ``notebookos``; that is a configuration, measured as such (README, "Results").

Pure, like every policy: decisions depend only on the snapshot and the request; ties are
broken by host id.
"""

from __future__ import annotations

from kernelfleet.scheduler.policies import NotebookOSPolicy
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot, KernelSnapshot


class PackingPolicy(NotebookOSPolicy):
    """NotebookOS with best-fit executor choice and migration targets."""

    name = "packing"

    def pick_executor(
        self, able: list[HostSnapshot], kernel: KernelSnapshot, gpus: int = 1
    ) -> HostSnapshot:
        """The replica host with the fewest idle GPUs that can commit the cell's `gpus` (best
        fit; on a tie the previous executor first, then the fastest free GPUs)."""
        return min(
            able,
            key=lambda h: (h.gpus_idle, h.id != kernel.executor_host, -h.free_speed(gpus), h.id),
        )

    def migration_target_for(
        self, snapshot: FleetSnapshot, gpus: int, exclude: tuple[str, ...]
    ) -> HostSnapshot | None:
        return best_fit_target(snapshot, gpus, exclude)


def best_fit_target(
    snapshot: FleetSnapshot, gpus: int, exclude: tuple[str, ...] = ()
) -> HostSnapshot | None:
    """The alive host, not in `exclude`, that can commit `gpus` with the fewest idle GPUs left
    (then fewest replicas, then the fastest free GPUs, then id); None if no host can."""
    able = [h for h in snapshot.alive_hosts() if h.id not in exclude and h.can_commit(gpus)]
    if not able:
        return None
    return min(able, key=lambda h: (h.gpus_idle, h.replicas, -h.free_speed(gpus), h.id))
