"""The waiting-order rule: older waiting cells first.

Cells that wait for GPUs are served in arrival order, and a cell may not take free GPUs on a
host where a cell that has waited longer could run: those GPUs are kept for the elder, so that a
cell needing 2 GPUs is not starved by a stream of 1-GPU cells.

One function states the rule, `held_for_elders`; the gateway's `ExecutorChooser`
(`kernelfleet.gateway.executors`) and the simulator's engine
(`kernelfleet.scheduler.simulator.engine`) both call it, so the simulator runs the gateway's
waiting order, not a copy of it. The callers own the queue and its order:

- they keep waiting cells in arrival order and, when GPUs are released or hosts change, ask the
  policy again for each, oldest first;
- a cell that the policy lets run on a host (after any migration) asks `held_for_elders` just
  before it takes the GPUs there, with as ``elders`` the cells still waiting that arrived before
  it: every waiting cell when it does not wait yet, else those ahead of it in the queue (a cell
  that got its GPUs leaves the queue at once, so it holds nobody back);
- only cells are elders: a kernel waiting to be admitted holds no host back.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol


class WaitingCell(Protocol):
    """A cell waiting for GPUs, as the rule sees it (any object with these two attributes)."""

    @property
    def gpus(self) -> int:
        """The GPUs it waits to take; 0 for a cell that needs none."""

    @property
    def hosts(self) -> Collection[str] | None:
        """The hosts it could run on, its kernel's replica hosts; None for any host (a kernel
        without replicas, whose cells run wherever GPUs are free, as under ``fcfs-batch``)."""


def held_for_elders(host_id: str, gpus: int, elders: Iterable[WaitingCell]) -> bool:
    """Whether a cell about to take `gpus` free GPUs on `host_id` must leave them, and wait,
    because one of `elders` (the cells waiting longer than it) could run on that host.

    `gpus` counts the GPUs the cell would newly commit there: 0 when it takes none, because it
    needs none or runs on GPUs its kernel already holds (a per-session binding, as under
    ``reservation``); such a cell is never held. An elder that needs no GPU holds nothing.

    Pure: no I/O, no clock. `elders` is iterated at most once, stopping at the first elder that
    holds the host, so it may be a generator.
    """
    if gpus == 0:
        return False
    return any(
        elder.gpus > 0 and (elder.hosts is None or host_id in elder.hosts) for elder in elders
    )
