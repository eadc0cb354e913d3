"""Running a plan: GPipe, 1F1B and interleaved 1F1B on worker processes (CPU, gloo) train a model
exactly as one process does; failures end the run with the worker's error and leave no process.

Worker processes are expensive (each imports torch), so the tests share one `WorkerPool` per rank
count (`pools`, in conftest.py), started when first asked for and again only after a test made it
fail.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from typing import Any

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.channel import ChannelTimeout, Listener, connect
from kernelfleet.tools.pipeline.runner import (
    RunResult,
    WorkerFailed,
    WorkerPool,
    run_pipeline,
    visible_gpus,
)
from kernelfleet.tools.pipeline.schedules import (
    check_run,
    rank_of_stage,
    schedule_kind,
    stages_of_rank,
)

torch = pytest.importorskip("torch")

STEPS = 2
LR = 0.05


def make_model(layers: int, seed: int = 0) -> Any:
    """``layers`` Linear layers of width 8 with Tanh between them: 2 * layers - 1 children."""
    torch.manual_seed(seed)
    children: list[Any] = []
    for index in range(layers):
        children.append(torch.nn.Linear(8, 8))
        if index < layers - 1:
            children.append(torch.nn.Tanh())
    return torch.nn.Sequential(*children)


def batch(size: int = 16) -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(size, 8, generator=generator), torch.randn(size, 8, generator=generator)


def single_process(model: Any, inputs: Any, targets: Any, steps: int) -> list[float]:
    """The reference: SGD on the whole batch in this process; the loss of every step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def check_equal_to_one_process(
    pool: WorkerPool,
    ranges: tuple[tuple[int, int], ...],
    schedule: str,
    microbatches: int,
    *,
    replicas: tuple[int, ...] | None = None,
    size: int = 16,
) -> RunResult:
    """Train on ``pool`` and in this process; assert equal losses and weights."""
    model = make_model((ranges[-1][1] + 2) // 2)
    reference = copy.deepcopy(model)
    inputs, targets = batch(size)
    result = run_pipeline(
        model,
        ranges,
        inputs,
        targets,
        loss=torch.nn.functional.mse_loss,
        schedule=schedule,
        microbatches=microbatches,
        steps=STEPS,
        lr=LR,
        pool=pool,
        replicas=replicas,
    )
    expected = single_process(reference, inputs, targets, STEPS)
    torch.testing.assert_close(list(result.losses), expected)
    # the notebook's model now holds the trained weights: equal to one process's after STEPS
    torch.testing.assert_close(dict(model.state_dict()), dict(reference.state_dict()))
    assert not torch.equal(model[0].weight, make_model(1)[0].weight)
    assert len(result.step_seconds) == STEPS
    assert result.samples_per_s > 0
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "ranges", "microbatches"),
    [
        ("gpipe", ((0, 2), (3, 6)), 4),
        ("1f1b", ((0, 4), (5, 6)), 2),
        # 4 virtual stages on 2 ranks: stages 0 and 2 on rank 0, 1 and 3 on rank 1
        ("interleaved", ((0, 1), (2, 3), (4, 5), (6, 6)), 4),
    ],
)
def test_two_ranks_train_as_one_process(
    pools: Callable[[int], WorkerPool],
    schedule: str,
    ranges: tuple[tuple[int, int], ...],
    microbatches: int,
) -> None:
    result = check_equal_to_one_process(pools(2), ranges, schedule, microbatches)
    assert (result.schedule, result.ranks) == (schedule, 2)


@pytest.mark.slow
def test_four_ranks_train_as_one_process(pools: Callable[[int], WorkerPool]) -> None:
    four = ((0, 0), (1, 1), (2, 4), (5, 6))  # stage 1 is a Tanh alone: no parameters
    eight = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 14))
    check_equal_to_one_process(pools(4), four, "gpipe", 4)
    check_equal_to_one_process(pools(4), four, "1f1b", 8)
    check_equal_to_one_process(pools(4), eight, "interleaved", 8)


def worker_processes() -> set[int]:
    """Pids of this test process's children that run a pipeline worker."""
    children = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if parent == os.getpid() and b"kernelfleet.tools.pipeline.worker" in command:
            children.add(int(entry))
    return children


FAULTY_LOSS = """
import os, signal, torch
calls = 0
def loss(output, target):
    global calls
    calls += 1
    if calls == FAIL_AT:
        if HOW == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise ValueError("the loss refuses microbatch %d" % calls)
    return torch.nn.functional.mse_loss(output, target)
"""


def faulty_loss(how: str, fail_at: int) -> Any:
    """A loss defined as a notebook defines it (module ``__main__``, so it travels by value)
    that kills its worker or raises at its ``fail_at``-th call: on the last rank, mid-run."""
    namespace: dict[str, Any] = {"__name__": "__main__", "HOW": how, "FAIL_AT": fail_at}
    exec(FAULTY_LOSS, namespace)
    return namespace["loss"]


def gone(pool: WorkerPool) -> bool:
    """Whether every process of ``pool`` has ended and been reaped."""
    return all(process.returncode is not None for process in pool.processes) and not (
        {process.pid for process in pool.processes} & worker_processes()
    )


@pytest.mark.slow
def test_a_worker_that_raises_fails_the_run_with_its_traceback(
    pools: Callable[[int], WorkerPool],
) -> None:
    pool, inputs, targets = pools(4), *batch()
    with pytest.raises(WorkerFailed) as failed:
        run_pipeline(
            make_model(3), ((0, 0), (1, 1), (2, 2), (3, 4)), inputs, targets,
            loss=faulty_loss("raise", 3), microbatches=4, steps=2, pool=pool,
        )  # fmt: skip
    message = str(failed.value)
    assert message.startswith("worker 3 failed:\nTraceback (most recent call last):")
    assert "ValueError: the loss refuses microbatch 3" in message
    assert pool.closed
    assert gone(pool)


@pytest.mark.slow
def test_a_worker_that_dies_fails_the_run_and_leaves_no_process(
    pools: Callable[[int], WorkerPool],
) -> None:
    pool, inputs, targets = pools(2), *batch()
    ranges = ((0, 0), (1, 2))
    with pytest.raises(WorkerFailed, match=r"worker 1 died \(signal 9\)"):
        run_pipeline(
            make_model(2), ranges, inputs, targets, loss=faulty_loss("kill", 6),
            microbatches=4, steps=3, pool=pool,
        )  # fmt: skip
    assert pool.closed
    assert gone(pool)
    with pytest.raises(WorkerFailed, match="closed"):
        run_pipeline(
            make_model(2), ranges, inputs, targets, loss=torch.nn.functional.mse_loss,
            microbatches=4, pool=pool,
        )  # fmt: skip


# ---- what is refused before any process starts --------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "stages", "ranks", "microbatches", "size", "message"),
    [
        ("gpipe", 3, 2, 2, 16, "the plan has 3 stages but only 2 workers"),
        ("1f1b", 2, 4, 4, 16, "2 stages for 4 workers"),
        ("gpipe", 2, 2, 3, 16, "3 microbatches do not divide the batch of 16"),
        ("1f1b", 4, 4, 2, 16, "1f1b needs at least as many microbatches as stages: 2 < 4"),
        ("interleaved", 2, 2, 4, 16, "interleaved needs at least 2 stages per worker"),
        ("interleaved", 6, 4, 4, 16, "6 stages on 4 workers"),
        ("interleaved", 4, 2, 5, 20, "a multiple of 2 (microbatches // workers), got 5"),
        ("gpipe", 2, 2, 0, 16, "at least 1"),
    ],
)
def test_layouts_a_schedule_cannot_run(
    schedule: str, stages: int, ranks: int, microbatches: int, size: int, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        check_run(
            schedule_kind(schedule),
            stages=stages,
            ranks=ranks,
            microbatches=microbatches,
            batch_size=size,
        )


def test_layouts_that_run() -> None:
    for schedule, stages, ranks, microbatches in [
        ("gpipe", 2, 2, 1),
        ("1f1b", 3, 3, 3),
        ("interleaved", 4, 2, 4),
        ("interleaved", 8, 4, 3),  # fewer microbatches than ranks: one round
    ]:
        check_run(
            schedule_kind(schedule),
            stages=stages,
            ranks=ranks,
            microbatches=microbatches,
            batch_size=24,
        )


def test_unknown_schedule() -> None:
    with pytest.raises(InvalidRequest, match="unknown schedule 'zb': choose one of gpipe, 1f1b"):
        schedule_kind("zb")


def test_interleaved_places_stage_i_on_rank_i_mod_ranks() -> None:
    assert [rank_of_stage(stage, 2) for stage in range(6)] == [0, 1, 0, 1, 0, 1]
    assert stages_of_rank(1, 8, 4) == [1, 5]
    assert stages_of_rank(2, 3, 3) == [2]


def test_bad_runs_are_refused_before_starting_workers() -> None:
    inputs, targets = batch()
    model = make_model(2)
    mse = torch.nn.functional.mse_loss
    for ranges, kwargs, message in [
        (((0, 1), (2, 3)), {}, "the stages cover layers 0-3 but the model has 3 layers"),
        (((0, 0), (2, 2)), {}, "stages must cover the layers in order from 0"),
        (((0, 0), (1, 2)), {"microbatches": 5}, "5 microbatches do not divide"),
        (((0, 0), (1, 2)), {"schedule": "zb"}, "unknown schedule"),
        (((0, 0), (1, 2)), {"ranks": 1}, "2 stages but only 1 workers"),
        (((0, 0), (1, 2)), {"steps": 0}, "steps must be at least 1"),
    ]:
        with pytest.raises(InvalidRequest, match=re.escape(message)):
            run_pipeline(model, ranges, inputs, targets, loss=mse, **kwargs)
    with pytest.raises(InvalidRequest, match="16 inputs but 8 targets"):
        run_pipeline(model, ((0, 0), (1, 2)), inputs, targets[:8], loss=mse)
    with pytest.raises(InvalidRequest, match="2 workers need 2 GPUs, one each; the cell holds 1"):
        WorkerPool(2, gpus=["3"])


def test_visible_gpus() -> None:
    assert visible_gpus({}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 0"}) == ["2", "0"]
    # in a fleet's kernel, the GPUs the cell holds, whatever the process could see
    assert visible_gpus({"KERNELFLEET_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == [
        "1",
        "3",
    ]
    assert visible_gpus({"KERNELFLEET_GPUS": "", "CUDA_VISIBLE_DEVICES": "0,1"}) == []


def test_the_channel_admits_only_the_runs_token() -> None:
    listener = Listener("secret")
    try:
        with pytest.raises(ChannelTimeout, match=r"no worker connected in 0\.1 s"):
            listener.accept(timeout=0.1)
        intruder = connect(listener.host, listener.port, "guess", timeout=5)
        with pytest.raises(PermissionError, match="without the run's token"):
            listener.accept(timeout=5)
        intruder.close()
        worker = connect(listener.host, listener.port, "secret", timeout=5)
        driver = listener.accept(timeout=5)
        driver.send(("job", torch.ones(2)))
        kind, tensor = worker.receive(timeout=5)
        assert kind == "job"
        assert torch.equal(tensor, torch.ones(2))
        with pytest.raises(ChannelTimeout):
            driver.receive(timeout=0.05)
        worker.close()
        with pytest.raises(EOFError):
            driver.receive(timeout=5)
        driver.close()
    finally:
        listener.close()
