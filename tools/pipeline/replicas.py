"""Replicated stages: which rank holds which replica, which microbatch each replica runs, and in
what order every rank runs its forwards and backwards (pure, no torch).

A PipeDream plan gives stage ``i`` ``r_i`` replicas (data-parallel copies); a replicated run has
``sum(r_i)`` ranks, one per replica, in stage order: stage 0's replicas on ranks
``0..r_0 - 1``, stage 1's on the next ``r_1``, and so on. Microbatch ``j`` runs on replica
``j mod r_i`` of stage ``i``, so a replica may run one microbatch more than its siblings.

The order of operations is set by a *clock*: every forward ``F(i, j)`` and backward
``B(i, j)`` (stage ``i``, microbatch ``j``) gets a time, and each rank runs its own operations
in increasing time. Both schedules' clocks make every dependency strictly earlier:

- ``F(i - 1, j)`` before ``F(i, j)`` (a forward needs the activation from upstream),
- ``F(last, j)`` before ``B(last, j)``, and ``B(i + 1, j)`` before ``B(i, j)`` (a backward
  needs the gradient from downstream).

`check_clock` verifies exactly that for a layout, and the executor (`replicated`) relies on it
for freedom from deadlock: see its docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from kernelfleet.errors import InvalidRequest

REPLICATED_SCHEDULES = ("gpipe", "1f1b")
"""The schedules the replicated executor runs (interleaving places one copy of each stage)."""

Kind = Literal["F", "B"]


@dataclass(frozen=True)
class Operation:
    """One forward (``"F"``) or backward (``"B"``) of ``microbatch`` at ``stage``, at ``time``."""

    kind: Kind
    stage: int
    microbatch: int
    time: int


@dataclass(frozen=True)
class ReplicaLayout:
    """Stage ``i`` has ``replicas[i]`` replicas, on consecutive ranks in stage order."""

    replicas: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.replicas or min(self.replicas) < 1:
            raise InvalidRequest(f"every stage needs at least 1 replica, got {self.replicas}")

    @property
    def ranks(self) -> int:
        return sum(self.replicas)

    @property
    def stages(self) -> int:
        return len(self.replicas)

    def rank(self, stage: int, replica: int) -> int:
        """The rank that holds ``replica`` of ``stage``."""
        return sum(self.replicas[:stage]) + replica

    def ranks_of(self, stage: int) -> tuple[int, ...]:
        """The ranks that hold ``stage``'s replicas, in replica order."""
        first = self.rank(stage, 0)
        return tuple(range(first, first + self.replicas[stage]))

    def placement(self, rank: int) -> tuple[int, int]:
        """``(stage, replica)`` of ``rank``."""
        for stage in range(self.stages):
            if rank in self.ranks_of(stage):
                return stage, rank - self.rank(stage, 0)
        raise ValueError(f"rank {rank} is not in a layout of {self.ranks} ranks")

    def rank_running(self, stage: int, microbatch: int) -> int:
        """The rank that runs ``microbatch`` at ``stage``: replica ``microbatch mod r``."""
        return self.rank(stage, microbatch % self.replicas[stage])

    def microbatches_of(self, rank: int, microbatches: int) -> list[int]:
        """The microbatches ``rank``'s replica runs, in order."""
        stage, replica = self.placement(rank)
        return list(range(replica, microbatches, self.replicas[stage]))

    def operations(self, rank: int, schedule: str, microbatches: int) -> list[Operation]:
        """``rank``'s forwards and backwards in the order it runs them (increasing time)."""
        stage, _ = self.placement(rank)
        clock = clock_of(schedule, self.stages, microbatches)
        mine = self.microbatches_of(rank, microbatches)
        operations = [
            Operation(kind, stage, j, clock(kind, stage, j)) for j in mine for kind in ("F", "B")
        ]
        return sorted(operations, key=lambda op: (op.time, op.kind == "F", op.microbatch))


Clock = Callable[[Kind, int, int], int]


def clock_of(schedule: str, stages: int, microbatches: int) -> Clock:
    """The clock of ``schedule`` for ``stages`` stages and ``microbatches`` microbatches.

    - ``gpipe``: ``F(i, j)`` at ``j + i``; every backward after every forward, microbatches in
      order, ``B(i, j)`` at ``M + S + j + (S - 1 - i)``.
    - ``1f1b``: ``F(i, j)`` at ``2j + i``, ``B(i, j)`` at ``2j + 2S - 1 - i``: one microbatch
      enters every two ticks and a stage alternates a forward and a backward once its first
      backward is due. With one replica per stage this is 1F1B exactly (stage ``i`` runs
      ``S - i`` forwards before its first backward); a replica of ``r`` runs about
      ``(S - i) / r`` of them (PipeDream's ``ceil(workers from here on / r)``).
    """
    last = stages - 1
    if schedule == "gpipe":

        def gpipe(kind: Kind, stage: int, j: int) -> int:
            if kind == "F":
                return j + stage
            return microbatches + stages + j + (last - stage)

        return gpipe
    if schedule == "1f1b":

        def one_f_one_b(kind: Kind, stage: int, j: int) -> int:
            return 2 * j + stage if kind == "F" else 2 * j + 2 * stages - 1 - stage

        return one_f_one_b
    raise InvalidRequest(
        f"replicated stages run with {' or '.join(REPLICATED_SCHEDULES)}, not {schedule!r} "
        f"(interleaving runs one copy of each stage; give --no-replicas to run it so)"
    )


def check_clock(clock: Clock, stages: int, microbatches: int) -> None:
    """Raise ``AssertionError`` unless every dependency of ``clock`` is strictly earlier."""
    last = stages - 1
    for j in range(microbatches):
        for stage in range(1, stages):
            assert clock("F", stage - 1, j) < clock("F", stage, j), ("F", stage, j)
        assert clock("F", last, j) < clock("B", last, j), ("B", last, j)
        for stage in range(last):
            assert clock("B", stage + 1, j) < clock("B", stage, j), ("B", stage, j)


def check_replicated_run(
    layout: ReplicaLayout, *, schedule: str, ranks: int, microbatches: int, batch_size: int
) -> None:
    """Raise `InvalidRequest`, in one line, if ``layout`` cannot run as asked."""
    clock_of(schedule, layout.stages, microbatches)  # refuses other schedules
    if microbatches < 1:
        raise InvalidRequest("workers and microbatches must be at least 1")
    if batch_size % microbatches:
        raise InvalidRequest(
            f"{microbatches} microbatches do not divide the batch of {batch_size} samples"
        )
    if ranks != layout.ranks:
        raise InvalidRequest(
            f"the stages have {layout.ranks} replicas in all ({describe(layout.replicas)}): "
            f"they need {layout.ranks} workers, one per replica, not {ranks} "
            f"(or give --no-replicas to run each stage once)"
        )


def describe(replicas: tuple[int, ...]) -> str:
    """``"x2,x1"``: each stage's replica count, in order."""
    return ",".join(f"x{count}" for count in replicas)
