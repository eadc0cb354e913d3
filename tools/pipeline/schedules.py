"""Pipeline schedules by name, where each stage runs, and what a schedule refuses before a run.

Three of ``torch.distributed.pipelining``'s schedules, all with synchronous (flush) semantics:
every step runs all its microbatches forward and backward and ends with their gradients
accumulated, scaled by ``1 / microbatches`` (torch's ``scale_grads``), so that with a loss that
averages over its batch the gradient equals the whole batch's.

- ``gpipe`` (``ScheduleGPipe``): all forwards, then all backwards; one stage per rank.
- ``1f1b`` (``Schedule1F1B``): after a warm-up, one forward then one backward; one stage per
  rank; torch wants at least as many microbatches as stages.
- ``interleaved`` (``ScheduleInterleaved1F1B``): each rank holds several *virtual stages*
  (chunks), stage ``i`` on rank ``i % ranks`` (Megatron's looping placement, the one torch's
  schedule assumes), so the bubble shrinks by the number of chunks per rank. It needs at least
  two stages per rank, the stages a multiple of the ranks, and the microbatches a multiple of
  ``max(1, microbatches // ranks)``.

`check_run` is pure (no torch): it says in one line what a run cannot do, before any process
starts. `schedule_class` imports torch and is called by the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest


@dataclass(frozen=True)
class ScheduleKind:
    """A schedule's name, torch's class for it, and how many stages each rank holds."""

    name: str
    torch_class: str
    multi_stage: bool
    """True when a rank holds several stages (``PipelineScheduleMulti``), False for exactly one."""


SCHEDULES: dict[str, ScheduleKind] = {
    kind.name: kind
    for kind in (
        ScheduleKind("gpipe", "ScheduleGPipe", multi_stage=False),
        ScheduleKind("1f1b", "Schedule1F1B", multi_stage=False),
        ScheduleKind("interleaved", "ScheduleInterleaved1F1B", multi_stage=True),
    )
}


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule called ``name``; `InvalidRequest` naming the known ones otherwise."""
    try:
        return SCHEDULES[name]
    except KeyError:
        known = ", ".join(SCHEDULES)
        raise InvalidRequest(f"unknown schedule {name!r}: choose one of {known}") from None


def default_ranks(kind: ScheduleKind, stages: int) -> int:
    """Ranks when none are asked for: one per stage, or two stages per rank when interleaved."""
    return max(1, stages // 2) if kind.multi_stage else stages


def rank_of_stage(stage: int, ranks: int) -> int:
    """The rank that runs ``stage``: ``stage % ranks`` (for one stage per rank, the stage)."""
    return stage % ranks


def stages_of_rank(rank: int, stages: int, ranks: int) -> list[int]:
    """The stages ``rank`` runs, in pipeline order."""
    return [stage for stage in range(stages) if rank_of_stage(stage, ranks) == rank]


def check_run(
    kind: ScheduleKind, *, stages: int, ranks: int, microbatches: int, batch_size: int
) -> None:
    """Raise `InvalidRequest`, in one line, if ``kind`` cannot run ``stages`` on ``ranks``
    processes with ``microbatches`` microbatches of a batch of ``batch_size`` samples."""
    if ranks < 1 or microbatches < 1:
        raise InvalidRequest("workers and microbatches must be at least 1")
    if batch_size % microbatches:
        raise InvalidRequest(
            f"{microbatches} microbatches do not divide the batch of {batch_size} samples"
        )
    if kind.multi_stage:
        if stages < 2 * ranks or stages % ranks:
            raise InvalidRequest(
                f"interleaved needs at least 2 stages per worker and the stages a multiple of "
                f"the workers: {stages} stages on {ranks} workers (plan more stages or use "
                f"fewer --workers)"
            )
        rounds = max(1, microbatches // ranks)
        if microbatches % rounds:
            raise InvalidRequest(
                f"interleaved on {ranks} workers needs the microbatches to be a multiple of "
                f"{rounds} (microbatches // workers), got {microbatches}"
            )
        return
    if stages > ranks:
        raise InvalidRequest(
            f"the plan has {stages} stages but only {ranks} workers: {kind.name} runs one "
            f"stage per worker (or use --schedule interleaved)"
        )
    if stages < ranks:
        raise InvalidRequest(
            f"the plan has {stages} stages for {ranks} workers: {kind.name} runs one stage "
            f"per worker"
        )
    if kind.name == "1f1b" and microbatches < stages:
        raise InvalidRequest(
            f"1f1b needs at least as many microbatches as stages: {microbatches} < {stages}"
        )


def schedule_class(kind: ScheduleKind) -> Any:
    """Torch's schedule class for ``kind`` (imports torch)."""
    from torch.distributed import pipelining

    return getattr(pipelining, kind.torch_class)
