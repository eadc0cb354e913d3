"""Replicated stages: the layout and the clocks (pure), a simulation showing that no layout can
deadlock with gloo's sends (and that 1F1B could with sends that wait for their receive), and
real runs on worker processes (CPU, gloo) that train exactly as one process does, with
microbatch counts that are and are not multiples of the replica counts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.replicas import (
    Operation,
    ReplicaLayout,
    check_clock,
    check_replicated_run,
    clock_of,
)
from kernelfleet.tools.pipeline.runner import WorkerFailed, WorkerPool, run_pipeline
from tests.tools.pipeline.test_run import batch, check_equal_to_one_process, gone, make_model

LAYOUTS = [(2, 1), (1, 2), (2, 2), (3, 1), (1, 2, 1), (1, 1, 1, 1), (3, 2, 1), (1,), (4,)]


def test_the_layout_places_replicas_on_consecutive_ranks() -> None:
    layout = ReplicaLayout((2, 1, 3))
    assert (layout.ranks, layout.stages) == (6, 3)
    assert [layout.ranks_of(stage) for stage in range(3)] == [(0, 1), (2,), (3, 4, 5)]
    assert [layout.placement(rank) for rank in range(6)] == [
        (0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (2, 2),
    ]  # fmt: skip
    # microbatch j on replica j mod r: 5 microbatches on 3 replicas go 2, 2, 1
    assert [layout.rank_running(2, j) for j in range(5)] == [3, 4, 5, 3, 4]
    assert [layout.microbatches_of(rank, 5) for rank in (3, 4, 5)] == [[0, 3], [1, 4], [2]]
    assert layout.microbatches_of(2, 5) == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidRequest, match="at least 1 replica"):
        ReplicaLayout((2, 0))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_dependency_is_earlier_on_the_clock(schedule: str) -> None:
    for stages in range(1, 7):
        for microbatches in range(1, 10):
            check_clock(clock_of(schedule, stages, microbatches), stages, microbatches)


def kinds(operations: list[Operation]) -> str:
    return "".join(f"{op.kind}{op.microbatch}" for op in operations)


def test_the_orders_of_gpipe_and_1f1b() -> None:
    single = ReplicaLayout((1, 1, 1))
    assert kinds(single.operations(0, "gpipe", 3)) == "F0F1F2B0B1B2"
    # 1F1B: stage i runs S - i forwards, then a backward and a forward in turn
    assert kinds(single.operations(0, "1f1b", 5)) == "F0F1F2B0F3B1F4B2B3B4"
    assert kinds(single.operations(1, "1f1b", 5)) == "F0F1B0F2B1F3B2F4B3B4"
    assert kinds(single.operations(2, "1f1b", 5)) == "F0B0F1B1F2B2F3B3F4B4"
    # a replica of 2 runs every other microbatch and keeps about half as many in flight
    replicated = ReplicaLayout((2, 1))
    assert kinds(replicated.operations(0, "1f1b", 5)) == "F0B0F2B2F4B4"
    assert kinds(replicated.operations(1, "1f1b", 5)) == "F1B1F3B3"
    assert kinds(replicated.operations(2, "1f1b", 5)) == "F0B0F1B1F2B2F3B3F4B4"


def simulate(layout: ReplicaLayout, schedule: str, microbatches: int, rendezvous: bool) -> bool:
    """Run every rank's operations as the executor does, one message at a time: a receive waits
    for its message; a send is queued (gloo) or, with ``rendezvous``, waits until its receiver
    takes it. True when every rank finishes, False when all are stuck (a deadlock)."""
    last = layout.stages - 1
    programs: list[list[tuple[str, str, int, int]]] = []  # (send|recv, F|B, microbatch, peer)
    for rank in range(layout.ranks):
        program = []
        for op in layout.operations(rank, schedule, microbatches):
            s, j = op.stage, op.microbatch
            if op.kind == "F":
                if s > 0:
                    program.append(("recv", "F", j, layout.rank_running(s - 1, j)))
                if s < last:
                    program.append(("send", "F", j, layout.rank_running(s + 1, j)))
            else:
                if s < last:
                    program.append(("recv", "B", j, layout.rank_running(s + 1, j)))
                if s > 0:
                    program.append(("send", "B", j, layout.rank_running(s - 1, j)))
        programs.append(program)
    position = [0] * layout.ranks
    sent: set[tuple[str, int, int]] = set()  # (kind, microbatch, receiver): queued
    taken: set[tuple[str, int, int]] = set()
    while any(position[r] < len(programs[r]) for r in range(layout.ranks)):
        moved = False
        for rank in range(layout.ranks):
            if position[rank] == len(programs[rank]):
                continue
            action, kind, j, peer = programs[rank][position[rank]]
            if action == "send":
                if (kind, j, peer) not in sent:
                    sent.add((kind, j, peer))
                    moved = True
                if rendezvous and (kind, j, peer) not in taken:
                    continue  # the send waits for its receive
            elif (kind, j, rank) in sent:
                taken.add((kind, j, rank))
            else:
                continue
            position[rank] += 1
            moved = True
        if not moved:
            return False
    return True


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_no_layout_deadlocks_with_sends_that_never_wait(
    layout: tuple[int, ...], schedule: str
) -> None:
    for microbatches in range(1, 9):
        assert simulate(ReplicaLayout(layout), schedule, microbatches, rendezvous=False)


def test_1f1b_would_deadlock_if_sends_waited_for_their_receive() -> None:
    """Why messages go through gloo even on GPUs (see `replicated`): a stage's forward send
    and its neighbour's backward send cross in 1F1B."""
    assert simulate(ReplicaLayout((1, 1)), "gpipe", 4, rendezvous=True)
    assert not simulate(ReplicaLayout((1, 1)), "1f1b", 4, rendezvous=True)


@pytest.mark.parametrize(
    ("layout", "kwargs", "message"),
    [
        ((2, 1), {"schedule": "interleaved"}, "replicated stages run with gpipe or 1f1b"),
        ((2, 1), {"ranks": 2}, "the stages have 3 replicas in all (x2,x1): they need 3 workers"),
        ((2, 2), {"microbatches": 5}, "5 microbatches do not divide the batch of 12 samples"),
        ((2, 2), {"microbatches": 0}, "at least 1"),
    ],
)
def test_runs_a_layout_cannot_make(
    layout: tuple[int, ...], kwargs: dict[str, Any], message: str
) -> None:
    asked = {"schedule": "gpipe", "ranks": sum(layout), "microbatches": 4, "batch_size": 12}
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        check_replicated_run(ReplicaLayout(layout), **(asked | kwargs))


def test_bad_replicated_runs_are_refused_before_starting_workers() -> None:
    inputs, targets = batch(12)
    model, mse = make_model(3), __import__("torch").nn.functional.mse_loss
    ranges = ((0, 2), (3, 4))
    for kwargs, message in [
        ({"replicas": (2, 1), "schedule": "interleaved"}, "not 'interleaved'"),
        ({"replicas": (2, 1), "ranks": 4}, "they need 3 workers, one per replica, not 4"),
        ({"replicas": (2, 1, 1)}, "2 stages but 3 replica counts"),
    ]:
        with pytest.raises(InvalidRequest, match=re.escape(message)):
            run_pipeline(model, ranges, inputs, targets, loss=mse, **kwargs)


# ---- real runs ----------------------------------------------------------------------------------


def _show(value: tuple[Any, ...]) -> str:
    """A test id: ranges as ``0-2,3-4``, replica counts as ``x2x1``."""
    if isinstance(value[0], tuple):
        return ",".join(f"{first}-{last}" for first, last in value)
    return "".join(f"x{count}" for count in value)


THREE = ((0, 2), (3, 4))  # a 3-Linear model: Linear Tanh Linear | Tanh Linear


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranges", "replicas", "schedule", "microbatches"),
    [
        (THREE, (2, 1), "gpipe", 3),  # replica 0 of stage 0 runs 2 microbatches, replica 1 one
        (THREE, (2, 1), "1f1b", 4),
        (THREE, (1, 2), "gpipe", 4),
        (THREE, (1, 2), "1f1b", 3),  # the last stage replicated: the step's loss is summed
        (THREE, (1, 2), "gpipe", 1),  # one microbatch: replica 1 idles, adds zero gradients
        (THREE, (2, 2), "gpipe", 3),
        (THREE, (2, 2), "1f1b", 4),
        (((0, 0), (1, 1), (2, 4)), (1, 2, 1), "1f1b", 6),  # a Tanh alone, replicated
        (THREE, (3, 1), "gpipe", 4),  # microbatches 0 and 3 on replica 0
    ],
    ids=lambda value: _show(value) if isinstance(value, tuple) else str(value),
)
def test_replicated_stages_train_as_one_process(
    pools: Callable[[int], WorkerPool],
    ranges: tuple[tuple[int, int], ...],
    replicas: tuple[int, ...],
    schedule: str,
    microbatches: int,
) -> None:
    result = check_equal_to_one_process(
        pools(sum(replicas)), ranges, schedule, microbatches, replicas=replicas, size=12
    )
    first = 0
    expected = []
    for count in replicas:
        expected.append(tuple(range(first, first + count)))
        first += count
    assert result.placement == tuple(expected)
    assert result.ranks == sum(replicas)


REPLICA_KILLER = """
import os, signal, torch
import torch.distributed as dist
calls = 0
def loss(output, target):
    global calls
    calls += 1
    if dist.get_rank() == 2 and calls == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return torch.nn.functional.mse_loss(output, target)
"""


@pytest.mark.slow
def test_a_replica_that_dies_fails_the_run_and_leaves_no_process(
    pools: Callable[[int], WorkerPool],
) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}  # travels by value, as a notebook's
    exec(REPLICA_KILLER, namespace)
    pool, (inputs, targets) = pools(3), batch(12)
    with pytest.raises(WorkerFailed, match=re.escape("worker 2 died (signal 9)")):
        run_pipeline(
            make_model(3), THREE, inputs, targets, loss=namespace["loss"], microbatches=4,
            steps=2, pool=pool, replicas=(1, 2),
        )  # fmt: skip
    assert pool.closed
    assert gone(pool)
