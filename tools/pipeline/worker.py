"""One pipeline rank: ``python -m kernelfleet.tools.pipeline.worker HOST PORT RANK``.

Started by `runner.WorkerPool`, one process per rank, with the pool's token in the environment
(``channel.TOKEN_ENV``). The worker connects to the driver at ``HOST:PORT`` and says
``("hello", rank)``. It then receives a `Session` and joins the pool's process group (the driver
holds its ``TCPStore``; nccl on a GPU, gloo on a CPU), and runs the `WorkerJob` messages that
follow, one after another, until it receives None. A job holds this rank's stages (modules; with
replicated stages, its one replica, run by `replicated`), the schedule, the batches for the first
and the last stage, the loss, the learning rate and the steps; for each the worker trains and
reports back:

- ``("step", step, loss, seconds)`` after every step, from the rank holding the last stage:
  the mean of the microbatches' losses and the step's wall time;
- ``("state", {stage: state_dict})`` at the end of the job, on the CPU;
- ``("done",)``. For any exception it sends ``("error", traceback_text)`` and exits 1.

A worker exits as soon as its driver's process is gone, even in the middle of a step.

The device comes from the environment: if torch sees a GPU (the driver gives each worker one of
the GPUs the notebook holds), the stages run on ``cuda:0`` with nccl, otherwise on the
CPU with gloo, using ``cpu_count // ranks`` threads. Same code either way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kernelfleet.tools.pipeline.channel import TOKEN_ENV, Channel, connect
from kernelfleet.tools.pipeline.schedules import schedule_class, schedule_kind

IDLE_S = 3600.0
"""How long a worker waits for its next job before it gives up (the driver ends it sooner)."""


@dataclass(frozen=True)
class Session:
    """The process group a worker joins: its rank among ``ranks``, the driver's store."""

    rank: int
    ranks: int
    store_host: str
    store_port: int
    timeout_s: float


@dataclass(frozen=True)
class WorkerJob:
    """What one rank runs. ``stages`` maps stage index to module (this rank's stages only)."""

    schedule: str
    microbatches: int
    stages: dict[int, Any]
    stage_count: int
    loss: Any
    """The loss function; every rank needs it: without one, torch runs a rank forward-only."""
    lr: float
    steps: int
    inputs: Any
    """The whole batch for stage 0, on the rank that holds it (None elsewhere)."""
    targets: Any
    """The whole batch of targets, on the rank that holds the last stage (None elsewhere)."""
    replicas: tuple[int, ...] | None = None
    """None: torch's schedule, one copy of each stage. Else each stage's replica count, and the
    rank runs its one replica with the replicated executor (`replicated`)."""


def choose_device() -> Any:
    """``cuda:0`` when torch sees a GPU (the one the driver gave this worker), else the CPU."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def join(session: Session, device: Any) -> None:
    """Join the session's process group: nccl on a GPU, gloo on the CPU. On the CPU the worker
    also takes its share of the host's cores for torch's threads (the ranks share the host)."""
    import torch
    import torch.distributed as dist

    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // session.ranks))
    timeout = timedelta(seconds=session.timeout_s)
    store = dist.TCPStore(
        session.store_host, session.store_port, session.ranks, is_master=False, timeout=timeout
    )
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=store,
        rank=session.rank,
        world_size=session.ranks,
        timeout=timeout,
    )


def run_job(job: WorkerJob, device: Any, channel: Channel) -> None:
    """Train ``job``'s stages for ``job.steps`` steps, reporting to ``channel``."""
    import torch

    if job.replicas is not None:
        from kernelfleet.tools.pipeline.replicated import run_replicated

        run_replicated(job, device, channel)
        return
    from torch.distributed.pipelining import PipelineStage

    indices = sorted(job.stages)
    modules = [job.stages[index].to(device) for index in indices]
    stages = [
        PipelineStage(module, index, job.stage_count, device)
        for index, module in zip(indices, modules, strict=True)
    ]
    kind = schedule_kind(job.schedule)
    schedule = schedule_class(kind)(
        stages if kind.multi_stage else stages[0],
        n_microbatches=job.microbatches,
        loss_fn=job.loss,
    )
    parameters = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=job.lr) if parameters else None  # a ReLU stage
    first, last = 0 in job.stages, job.stage_count - 1 in job.stages
    args = (job.inputs.to(device),) if first else ()
    target = job.targets.to(device) if last else None
    for step in range(job.steps):
        started = time.perf_counter()
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        losses: list[Any] = []
        if last:
            schedule.step(*args, target=target, losses=losses)
        else:
            schedule.step(*args)
        if optimizer is not None:
            optimizer.step()
        if last:
            loss = torch.stack([x.detach().float() for x in losses]).mean().item()
            channel.send(("step", step, loss, time.perf_counter() - started))
    states = {
        index: {key: value.detach().cpu() for key, value in module.state_dict().items()}
        for index, module in zip(indices, modules, strict=True)
    }
    channel.send(("state", states))


def exit_with_parent(interval_s: float = 1.0) -> None:
    """End this process, from a daemon thread, as soon as the process that started it (the
    driver) is gone, even in the middle of a step; between jobs the closed connection does."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    exit_with_parent()
    host, port, rank = argv[0], int(argv[1]), int(argv[2])
    channel = connect(host, port, os.environ.pop(TOKEN_ENV), timeout=60.0)
    try:
        channel.send(("hello", rank))
        session = channel.receive(timeout=120.0)
        device = choose_device()
        join(session, device)
        while (job := channel.receive(timeout=IDLE_S)) is not None:
            run_job(job, device, channel)
            channel.send(("done",))
        dist.destroy_process_group()
        return 0
    except BaseException:
        with contextlib.suppress(OSError):  # the driver may be gone
            channel.send(("error", traceback.format_exc()))
        return 1
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
