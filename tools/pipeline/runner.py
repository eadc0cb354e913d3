"""Train a model's pipeline stages on worker processes; the caller (the notebook) is the driver.

`run_pipeline` splits the model at the given stage ranges, starts one worker process per rank
(``python -m kernelfleet.tools.pipeline.worker``; a `WorkerPool`, which several runs may share),
sends each its stages (cloudpickled, so a
model defined in the notebook works), the batches and the schedule, and collects the loss and
wall time of every step from the rank that holds the last stage. At the end it loads the trained
weights back into the caller's model, in place.

A stage with several replicas (``replicas``, from a PipeDream plan) gets one rank per replica,
and the whole run then goes to the replicated executor (`replicated`: microbatch ``j`` on
replica ``j mod r`` of each stage, the replicas' gradients summed after the flush); without
replicas it goes to torch's schedules (`schedules`).

Semantics are synchronous (flush): each step runs every microbatch forward and backward, then
each worker applies plain SGD (``lr``) to its stages once. With a loss that averages over its
batch (``mse_loss``, ``cross_entropy``) and microbatches of equal size, one step is exactly the
single-process step on the whole batch, up to floating-point summation order.

Failures: every wait has a timeout (``timeout_s`` without any message from a worker). A worker
that raises makes the run raise `WorkerFailed` with the worker's traceback; a worker that dies
makes it raise ``worker 2 died (signal 9)`` (a death by a signal is reported first, since the
other workers' errors then follow from it). Whatever happens, every worker process is gone when
`run_pipeline` returns or raises, and the driver's listener and store are closed.

Devices: the GPUs the caller holds are those ``KERNELFLEET_GPUS`` lists in a kernel of a fleet
(a ``%%gpus N`` cell binds them), else those ``CUDA_VISIBLE_DEVICES`` lists (a fleet job). Worker
``r`` gets the ``r``-th of them as its only visible GPU and runs on it with nccl; one GPU per
rank is required. With none listed, the workers see no GPU (``CUDA_VISIBLE_DEVICES`` empty) and
run on the CPU with gloo, so that ranks never share a GPU by accident.

Where the workers run (`kernelfleet.tools.pipeline.launchers`): the ranks the cell's GPUs cover
(all of them without GPUs) run here, as child processes. In a fleet's kernel whose cell holds
some GPUs but fewer than the run has ranks, the others run on GPUs of other hosts of the fleet,
started by the gateway for the cell (``hosts="auto"``, the default); ``hosts="fleet"`` asks the
fleet for every rank the cell's GPUs do not cover, even when it holds none, and ``hosts="local"``
never asks (too few GPUs is then an error, as before). The workers reach the driver by a TCP
address, on which the listener and the process group's store both listen: ``127.0.0.1`` while
every worker runs here, else the host's address the fleet's other hosts reach it at
(``KERNELFLEET_HOST_ADDRESS``, which the host agent sets from its ``--kernel-ip``), or the
``address`` given.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from kernelfleet.client import ClientError, FleetClient
from kernelfleet.errors import FleetError, InvalidRequest
from kernelfleet.protocol import ReplicaEnv
from kernelfleet.tools.pipeline.channel import Channel, ChannelTimeout, Listener
from kernelfleet.tools.pipeline.launchers import (
    FleetWorkers,
    LocalWorkers,
    Workers,
    wait_exit,
)
from kernelfleet.tools.pipeline.replicas import ReplicaLayout, check_replicated_run
from kernelfleet.tools.pipeline.schedules import (
    check_run,
    default_ranks,
    rank_of_stage,
    schedule_kind,
)
from kernelfleet.tools.pipeline.stages import Range, split_model, write_back
from kernelfleet.tools.pipeline.worker import Session, WorkerJob

HOSTS = ("auto", "local", "fleet")
"""Where a pool's workers may run (see the module docstring)."""


class WorkerFailed(FleetError):
    """A worker raised, died or went silent: the run is over and its processes are gone."""

    reason = "worker-failed"


@dataclass(frozen=True)
class RunResult:
    """What a run did: the loss and wall time of each step, and how it was laid out."""

    schedule: str
    ranks: int
    microbatches: int
    ranges: tuple[Range, ...]
    batch_size: int
    losses: tuple[float, ...]
    step_seconds: tuple[float, ...]
    notes: tuple[str, ...] = ()
    placement: tuple[tuple[int, ...], ...] = ()
    """The ranks that hold each stage (several for a replicated stage); empty means one rank
    per stage, stage ``i`` on rank ``i % ranks``."""

    @property
    def ranks_of_stages(self) -> tuple[tuple[int, ...], ...]:
        """The ranks that hold each stage, in stage order."""
        if self.placement:
            return self.placement
        return tuple((rank_of_stage(index, self.ranks),) for index in range(len(self.ranges)))

    @property
    def samples_per_s(self) -> float:
        """Throughput of the steps after the first (which also sets up the pipeline), or of
        the only step."""
        steady = self.step_seconds[1:] or self.step_seconds
        return self.batch_size * len(steady) / sum(steady)


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs the caller holds: ``KERNELFLEET_GPUS`` in a fleet's kernel (set, even empty,
    while a cell runs there), else ``CUDA_VISIBLE_DEVICES``; none when empty or ``-1``."""
    environ = os.environ if environ is None else environ
    value = environ.get(ReplicaEnv.GPUS.value, environ.get("CUDA_VISIBLE_DEVICES", ""))
    gpus = [item.strip() for item in value.split(",") if item.strip()]
    return [] if gpus in ([], ["-1"]) else gpus


def run_pipeline(
    model: Any,
    ranges: tuple[Range, ...],
    inputs: Any,
    targets: Any,
    *,
    loss: Any,
    schedule: str = "gpipe",
    microbatches: int = 1,
    steps: int = 1,
    lr: float = 0.01,
    ranks: int | None = None,
    timeout_s: float = 120.0,
    notes: tuple[str, ...] = (),
    pool: WorkerPool | None = None,
    replicas: tuple[int, ...] | None = None,
    hosts: str = "auto",
) -> RunResult:
    """Train ``model`` for ``steps`` SGD steps on the batch ``inputs``/``targets``, its
    layers split into stages ``ranges`` run on ``ranks`` worker processes by ``schedule``
    (see the module docstring), and write the trained weights back into ``model``.

    ``replicas`` gives each stage's replica count (one each when None); a run with a
    replicated stage needs one rank per replica and runs on the replicated executor
    (`replicated`, gpipe or 1f1b), the others on torch's schedules.

    ``loss(output, target)`` must average over its batch. The run starts its own `WorkerPool`
    (its workers where ``hosts`` says) and ends it, unless given ``pool`` (of ``ranks``
    workers), which it leaves running. Raises
    `InvalidRequest` for a run that cannot be laid out (before starting anything) and
    `WorkerFailed` if a worker fails (a pool is then closed).
    """
    replicas = replicas or (1,) * len(ranges)
    if len(replicas) != len(ranges):
        raise InvalidRequest(f"{len(ranges)} stages but {len(replicas)} replica counts")
    layout = ReplicaLayout(replicas)
    replicated = layout.ranks > layout.stages
    kind = schedule_kind(schedule)
    if replicated:
        ranks = ranks or (pool.ranks if pool is not None else layout.ranks)
    else:
        ranks = ranks or (pool.ranks if pool is not None else default_ranks(kind, len(ranges)))
    pieces = split_model(model, ranges)
    batch_size = len(inputs)
    if replicated:
        check_replicated_run(
            layout, schedule=kind.name, ranks=ranks, microbatches=microbatches,
            batch_size=batch_size,
        )  # fmt: skip
    else:
        check_run(
            kind, stages=len(ranges), ranks=ranks, microbatches=microbatches,
            batch_size=batch_size,
        )  # fmt: skip
    if len(targets) != batch_size:
        raise InvalidRequest(f"{batch_size} inputs but {len(targets)} targets")
    if steps < 1 or not lr >= 0 or timeout_s <= 0:
        raise InvalidRequest("steps must be at least 1, lr at least 0, the timeout positive")
    if replicated:
        placement = tuple(layout.ranks_of(stage) for stage in range(layout.stages))
    else:
        placement = tuple((rank_of_stage(stage, ranks),) for stage in range(len(ranges)))
    last = len(ranges) - 1
    jobs: dict[int, WorkerJob] = {}
    for rank in range(ranks):
        mine = [stage for stage, held in enumerate(placement) if rank in held]
        jobs[rank] = WorkerJob(
            schedule=kind.name,
            microbatches=microbatches,
            stages={index: pieces[index] for index in mine},
            stage_count=len(ranges),
            loss=loss,
            lr=lr,
            steps=steps,
            inputs=inputs if 0 in mine else None,
            targets=targets if last in mine else None,
            replicas=replicas if replicated else None,
        )
    if pool is None:
        with WorkerPool(ranks, timeout_s=timeout_s, hosts=hosts) as own:
            losses, seconds, states = own.run(jobs, steps)
            notes = (*notes, *own.placement_notes())
    elif pool.ranks != ranks:
        raise InvalidRequest(f"a run on {ranks} workers given a pool of {pool.ranks}")
    else:
        losses, seconds, states = pool.run(jobs, steps)
        notes = (*notes, *pool.placement_notes())
    write_back(model, ranges, states)
    return RunResult(
        kind.name,
        ranks,
        microbatches,
        ranges,
        batch_size,
        losses,
        seconds,
        notes=notes,
        placement=placement,
    )


class WorkerPool:
    """``ranks`` worker processes in one process group, which run jobs one after another, and
    the driver's listener and store. A context manager: leaving it ends every worker.

    Starting the workers (a Python with torch each) costs seconds; a pool lets several runs
    share them. After a failure the pool is closed and cannot run again.

    ``gpus``: the GPUs the cell holds (`visible_gpus` by default); ``hosts``: where the ranks
    they do not cover run (`HOSTS`, see the module docstring); ``fleet``: the kernel's client
    (`FleetClient.from_environment` by default); ``address``: the one the workers reach the
    driver at when some run elsewhere.
    """

    def __init__(
        self,
        ranks: int,
        *,
        timeout_s: float = 120.0,
        gpus: list[str] | None = None,
        hosts: str = "auto",
        fleet: FleetClient | None = None,
        address: str | None = None,
    ) -> None:
        import torch.distributed as dist

        gpus = visible_gpus() if gpus is None else gpus
        local = ranks if not gpus and hosts != "fleet" else min(ranks, len(gpus))
        client = None if local == ranks else self._fleet_client(ranks, gpus, hosts, fleet)
        self.ranks = ranks
        self.closed = False
        self.timeout_s = timeout_s
        token = secrets.token_hex(16)
        if client is not None:
            address = address or os.environ.get(ReplicaEnv.HOST_ADDRESS.value) or "127.0.0.1"
        self.listener = Listener(token, address or "127.0.0.1")
        self.host = self.listener.host
        self.store: Any = dist.TCPStore(
            self.host,
            0,
            ranks,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
        )
        self.channels: dict[int, Channel] = {}
        self.workers: list[Workers] = []
        try:
            port = self.listener.port
            self.workers.append(LocalWorkers(range(local), self.host, port, token, gpus))
            if client is not None:
                remote = range(local, ranks)
                self.workers.append(FleetWorkers(client, remote, self.host, port, token))
            self._accept_all()
            for rank, channel in self.channels.items():
                channel.send(Session(rank, ranks, self.host, self.store.port, timeout_s))
        except BaseException:
            self.close(graceful=False)
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        self.close(graceful=kind is None)

    def run(
        self, jobs: dict[int, WorkerJob], steps: int
    ) -> tuple[tuple[float, ...], tuple[float, ...], dict[int, dict[str, Any]]]:
        """Run one job per rank; every step's loss and seconds, and every stage's trained
        state. `WorkerFailed` (and the pool closed) at the first failure or silence."""
        if self.closed:
            raise WorkerFailed("this pool of workers was closed")
        try:
            for rank, channel in self.channels.items():
                channel.send(jobs[rank])
            return self._collect(steps)
        except BaseException:
            self.close(graceful=False)
            raise

    @staticmethod
    def _fleet_client(
        ranks: int, gpus: list[str], hosts: str, fleet: FleetClient | None
    ) -> FleetClient | None:
        """The client to ask the fleet for the ranks the cell's GPUs do not cover; None when
        they are to run here (`InvalidRequest` when they cannot)."""
        if hosts not in HOSTS:
            raise InvalidRequest(f"hosts must be one of {', '.join(HOSTS)}, not {hosts!r}")
        short = f"{ranks} workers need {ranks} GPUs, one each; the cell holds {len(gpus)}"
        if hosts == "local":
            raise InvalidRequest(short)
        if fleet is not None:
            return fleet
        try:
            return FleetClient.from_environment()
        except ClientError as e:
            raise InvalidRequest(f"{short}, and the fleet cannot lend more: {e}") from None

    def placement_notes(self) -> tuple[str, ...]:
        """Where the workers that do not run here run, for a run's notes."""
        notes = []
        for workers in self.workers:
            if isinstance(workers, FleetWorkers):
                placed = ", ".join(
                    f"{rank} on {host} (GPU {','.join(devices)})"
                    for rank, (host, devices) in sorted(workers.hosts().items())
                )
                notes.append(f"fleet workers {placed}")
        return tuple(notes)

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The worker processes that run here, children of this process, by rank."""
        local = (w for w in self.workers if isinstance(w, LocalWorkers))
        return [process for workers in local for process in workers.processes.values()]

    def _of(self, rank: int) -> Workers:
        return next(workers for workers in self.workers if rank in workers.ranks)

    def _accept_all(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while len(self.channels) < self.ranks:
            for rank in range(self.ranks):
                if rank not in self.channels and self._of(rank).exit_code(rank) is not None:
                    raise self._death(rank)
            if time.monotonic() > deadline:
                raise WorkerFailed(f"the workers did not all connect in {self.timeout_s:g} s")
            try:
                channel = self.listener.accept(timeout=0.5)
            except (ChannelTimeout, PermissionError):
                continue
            _hello, rank = channel.receive(timeout=self.timeout_s)
            self.channels[rank] = channel

    def _collect(
        self, steps: int
    ) -> tuple[tuple[float, ...], tuple[float, ...], dict[int, dict[str, Any]]]:
        losses: dict[int, float] = {}
        seconds: dict[int, float] = {}
        states: dict[int, dict[str, Any]] = {}
        running = dict(self.channels)
        while running:
            ranks = {channel.connection: rank for rank, channel in running.items()}
            ready = wait(list(ranks), timeout=self.timeout_s)
            if not ready:
                raise WorkerFailed(
                    f"no word from workers {sorted(running)} in {self.timeout_s:g} s"
                )
            for connection in ready:
                rank = ranks[connection]  # type: ignore[index]
                channel = running[rank]
                try:
                    message = channel.receive(timeout=self.timeout_s)
                except EOFError:
                    raise self._death(rank) from None
                if message[0] == "step":
                    losses[message[1]], seconds[message[1]] = message[2], message[3]
                elif message[0] == "state":
                    states.update(message[1])
                elif message[0] == "done":
                    del running[rank]
                else:
                    raise self._failure(rank, message[1])
        if len(losses) != steps:
            raise WorkerFailed(f"{len(losses)} of {steps} steps reported a loss")
        return (
            tuple(losses[s] for s in range(steps)),
            tuple(seconds[s] for s in range(steps)),
            states,
        )

    def _killed(self) -> WorkerFailed | None:
        """A worker killed by a signal, waiting briefly (as long as the slowest launcher takes
        to learn of a death): it is the cause of what follows."""
        deadline = time.monotonic() + max((w.notice_s for w in self.workers), default=0.5)
        while True:
            for rank in range(self.ranks):
                workers = self._of(rank)
                code = workers.exit_code(rank)
                if code is not None and code < 0:
                    return WorkerFailed(f"worker {rank} died (signal {-code}){workers.where(rank)}")
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def _failure(self, rank: int, text: str) -> WorkerFailed:
        return self._killed() or WorkerFailed(f"worker {rank} failed:\n{text.rstrip()}")

    def _death(self, rank: int) -> WorkerFailed:
        killed = self._killed()
        if killed is not None:
            return killed
        workers = self._of(rank)
        code = wait_exit(workers, rank, timeout=5)
        where = workers.where(rank)
        if code is None:
            return WorkerFailed(f"worker {rank}{where} closed its connection and is still running")
        return WorkerFailed(
            f"worker {rank} died (exit code {code}){where}:\n{workers.log_tail(rank)}"
        )

    def close(self, graceful: bool = True) -> None:
        """End every worker and close the channels, the listener and the store. A graceful
        close tells the workers to leave and gives them a moment; the rest are killed."""
        if self.closed:
            return
        self.closed = True
        for channel in self.channels.values():
            if graceful:
                with contextlib.suppress(OSError):
                    channel.send(None)
            channel.close()
        for workers in self.workers:
            workers.close(graceful)
        self.listener.close()
        self.store = None
