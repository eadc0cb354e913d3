"""Tool workers: processes a kernel's running cell starts on GPUs of any hosts of the fleet.

``POST /api/fleet/kernels/{id}/workers`` (the kernel's own token, or the fleet token) asks
for ``count`` workers of ``gpus_each`` GPUs each, running an allowed module
(`kernelfleet.protocol.TOOL_WORKER_MODULES`: the pipeline's stage worker). The
service (`ToolWorkerService`):

- takes the running cell of the kernel (a kernel that runs no cell gets 409: workers live only
  while a cell does);
- places the workers (`kernelfleet.gateway.worker_placement`: the cell's host first, then as
  few hosts as possible) on devices no cell binds and no other workers hold, on hosts that take
  work, and **holds** those devices in the GPU ledger for the group (`GpuLedger.hold`).
  Devices lent to background jobs are taken last, and those jobs are preempted (stopped, and
  requeued) before the workers start: cells first, as for a cell's own GPUs. A request the
  fleet could never fit, or cannot fit now, is 409 naming the counts: it does not wait;
- has each host's agent start its workers (``POST /api/workers``), with exactly their devices;
  if any launch fails, the others are stopped and the devices freed, and the request fails.

A group of workers ends, its workers stopped (SIGTERM, ``grace``, SIGKILL), when it is
deleted, when all its workers exited, when the cell that started it ends, when its kernel goes,
when a host of its workers is lost or stops running them, and when the ledger no longer holds
all its devices (a device vanished). A sweep every ``sweep_s`` seconds checks all but the first
(deletion acts at once); host reports update the workers' states at once.

A worker's devices stay held (`GpuLedger.unhold` ends them) until it is known gone: its agent
answered the stop, or reports it exited or no longer lists it, or its host is lost (the ledger
drops a lost host's devices itself). Until all its workers are gone, and forgotten by their
agents, the group is ``ending`` (kept, even when its kernel went); the sweep retries the stops
that failed. So no cell is given
a device a worker may still use, except after a host was lost: what it still runs when it
comes back is stopped as a stray, while its devices are already free.

Ended groups are kept (the last `KEPT_ENDED` of each kernel) for ``GET``, with their workers'
exit codes and log tails. A running worker that a host reports but no group knows (a gateway
restarted under it) is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelfleet.errors import Conflict, FleetError, InvalidRequest, NotFound
from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.records import KernelRecord
from kernelfleet.gateway.worker_placement import WorkerSlot, place_workers
from kernelfleet.protocol import check_tool_args, check_tool_env, check_tool_module

log = logging.getLogger("kernelfleet.gateway.tool_workers")

KEPT_ENDED = 4
"""Ended groups kept per kernel for ``GET`` (the oldest go first)."""
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class RunningCell:
    """The cell a kernel runs now, and the host it runs on."""

    cell_id: str
    host_id: str | None


class KernelCells(Protocol):
    """What the service asks of the kernels (`kernelfleet.gateway.kernel_service`)."""

    def running_cell(self, kernel_id: str) -> RunningCell | None:
        """The kernel's running cell, None when it runs none; `NotFound` for no such kernel."""


class KernelsById(Protocol):
    def get(self, kernel_id: str) -> KernelRecord:
        """The kernel; `NotFound` if there is none."""


class KernelServiceCells:
    """`KernelCells` over the kernel service. A kernel's running cell is its oldest cell that
    has not ended (`KernelRecord.recent_cells`: cells run one at a time, in order), even before
    the gateway hears that it started (the kernel's code may ask for workers sooner); its host
    is the one its GPUs are bound on, else the executor replica's, else the first replica's."""

    def __init__(self, kernels: KernelsById, ledger: GpuLedger) -> None:
        self._kernels = kernels
        self._ledger = ledger

    def running_cell(self, kernel_id: str) -> RunningCell | None:
        kernel = self._kernels.get(kernel_id)
        cell = next((c for c in kernel.recent_cells if c.outcome is None), None)
        if cell is None:
            return None
        bound = (self._ledger.binding(kernel_id, replica.id) for replica in kernel.replicas)
        hosts = [b.host_id for b in bound if b is not None and b.cell_id == cell.id]
        hosts += [r.host_id for r in kernel.replicas if r.id == kernel.executor]
        hosts += [r.host_id for r in kernel.replicas]
        return RunningCell(cell.id, cell.host or (hosts[0] if hosts else None))


class JobsToPreempt(Protocol):
    async def preempt(self, job_ids: tuple[str, ...], why: str) -> None: ...

    def gpus_released(self) -> None: ...


@dataclass
class ToolWorker:
    """One worker process of a group."""

    id: str
    index: int
    host_id: str
    device_ids: tuple[str, ...]
    state: str = "starting"
    """``starting``, ``running`` or ``exited``."""
    exit_code: int | None = None
    log_tail: list[str] = field(default_factory=list)
    released: bool = False
    """Known gone (stopped, exited, or its host lost) and its devices' holds ended."""
    forgotten: bool = False
    """Its agent keeps it no more (forgotten, or never started there), or its host was lost."""

    def model(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "index": self.index,
            "host": self.host_id,
            "devices": list(self.device_ids),
            "state": self.state,
            "exit_code": self.exit_code,
            "log_tail": list(self.log_tail),
        }


@dataclass
class WorkerGroup:
    """The workers one request started, for one cell of one kernel."""

    id: str
    kernel_id: str
    cell_id: str
    module: str
    workers: list[ToolWorker]
    created_at: float = field(default_factory=time.time)
    state: str = "starting"
    """``starting`` (being launched), ``running``, ``ending`` or ``ended``."""
    ended_why: str = ""

    def holds(self) -> dict[str, tuple[str, ...]]:
        """Host -> the devices its workers were given, in the host's order of the workers."""
        found: dict[str, tuple[str, ...]] = {}
        for worker in self.workers:
            found[worker.host_id] = found.get(worker.host_id, ()) + worker.device_ids
        return found

    def model(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kernel_id": self.kernel_id,
            "cell_id": self.cell_id,
            "module": self.module,
            "state": self.state,
            "ended_why": self.ended_why or None,
            "workers": [worker.model() for worker in self.workers],
        }


@dataclass(frozen=True)
class WorkersRequest:
    """The body of ``POST .../workers``, checked."""

    count: int
    gpus_each: int
    module: str
    args: tuple[str, ...]
    args_each: tuple[tuple[str, ...], ...]
    env: dict[str, str]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> WorkersRequest:
        count, gpus_each = body.get("count"), body.get("gpus_each", 1)
        for name, value in (("count", count), ("gpus_each", gpus_each)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
                raise InvalidRequest(f"'{name}' must be an integer from 1 to 1024, not {value!r}")
        assert isinstance(count, int)
        assert isinstance(gpus_each, int)
        each = body.get("args_each")
        if each is None:
            args_each: tuple[tuple[str, ...], ...] = ((),) * count
        elif isinstance(each, list) and len(each) == count:
            args_each = tuple(check_tool_args(args, "args_each") for args in each)
        else:
            raise InvalidRequest(f"'args_each' must be a list of {count} lists of strings")
        return cls(
            count,
            gpus_each,
            check_tool_module(body.get("module")),
            check_tool_args(body.get("args", [])),
            args_each,
            check_tool_env(body.get("env", {})),
        )


class ToolWorkerService:
    """The tool workers of every kernel; see the module docstring. Runs on the event loop."""

    def __init__(
        self,
        hosts: HostRegistry,
        ledger: GpuLedger,
        cells: KernelCells,
        jobs: JobsToPreempt | None = None,
        *,
        grace: float = 5.0,
        sweep_s: float = 0.5,
        new_id: Callable[[], str] = lambda: secrets.token_hex(4),
    ) -> None:
        self._hosts = hosts
        self._ledger = ledger
        self._cells = cells
        self._jobs = jobs
        self.grace = grace
        self.sweep_s = sweep_s
        self._new_id = new_id
        self._groups: dict[str, WorkerGroup] = {}
        self._ending: dict[str, asyncio.Task[WorkerGroup]] = {}
        self._launching: dict[str, asyncio.Event] = {}
        """Groups whose launches are under way: set once they all answered."""
        self._strays: set[asyncio.Task[None]] = set()
        hosts.observe(self)

    # ---- the API ---------------------------------------------------------------------------

    def groups(self, kernel_id: str) -> list[WorkerGroup]:
        """The kernel's groups, oldest first (ended ones too, the last few)."""
        return [group for group in self._groups.values() if group.kernel_id == kernel_id]

    def get(self, kernel_id: str, group_id: str) -> WorkerGroup:
        group = self._groups.get(group_id)
        if group is None or group.kernel_id != kernel_id:
            raise NotFound(f"kernel {kernel_id} has no tool workers {group_id!r}")
        return group

    async def start(self, kernel_id: str, body: Mapping[str, Any]) -> WorkerGroup:
        """Place, hold and launch the workers a request asks for; see the module docstring."""
        request = WorkersRequest.from_json(body)
        cell = self._cells.running_cell(kernel_id)
        if cell is None:
            raise Conflict(f"kernel {kernel_id} runs no cell: tool workers live while one runs")
        free, total = self._free_devices()
        slots = place_workers(
            free, request.count, request.gpus_each, prefer=cell.host_id, total=total
        )
        group = self._new_group(kernel_id, cell.cell_id, request.module, slots)
        preempted = self._hold(group)
        self._groups[group.id] = group
        self._launching[group.id] = asyncio.Event()
        try:
            try:
                if preempted and self._jobs is not None:
                    await self._jobs.preempt(preempted, f"tool workers of kernel {kernel_id}")
                await asyncio.gather(
                    *(self._launch(group, worker, request) for worker in group.workers)
                )
            finally:
                self._launching.pop(group.id).set()
        except BaseException as e:
            await self._end(group, f"a worker could not start: {e}")
            raise
        if group.state == "starting":  # else deleted while it started: ending already
            group.state = "running"
        log.info("kernel %s: tool workers %s started on %s", kernel_id, group.id,
                 ", ".join(f"{h}:{','.join(d)}" for h, d in group.holds().items()))  # fmt: skip
        return group

    async def stop(self, kernel_id: str, group_id: str) -> WorkerGroup:
        """End a group (deleted): its workers stopped, its devices freed. Idempotent."""
        return await self._end(self.get(kernel_id, group_id), "deleted")

    async def ending(self, group: WorkerGroup) -> WorkerGroup:
        """The group once the ending under way (a sweep's, say) is done; at once if none is."""
        task = self._ending.get(group.id)
        return group if task is None else await asyncio.shield(task)

    async def refresh_logs(self, group: WorkerGroup, everyone: bool = False) -> WorkerGroup:
        """Fetch from their agents (those it can) the log tails of the group's workers that
        exited (the error path; of all of them when `everyone`): a poll while all run asks the
        agents nothing. An ended group's tails were fetched when it ended."""

        async def tail(worker: ToolWorker) -> None:
            with contextlib.suppress(FleetError):
                client = self._hosts.get(worker.host_id).client
                worker.log_tail = await client.worker_log(worker.id, LOG_TAIL_LINES)

        if group.state != "ended":
            wanted = [w for w in group.workers if everyone or w.state == "exited"]
            await asyncio.gather(*(tail(worker) for worker in wanted if not worker.forgotten))
        return group

    # ---- ending ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """The sweep: every ``sweep_s`` seconds, end the groups that must end."""
        while not stop.is_set():
            self.sweep()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.sweep_s)

    def sweep(self) -> None:
        """End (in the background) every running group that has a reason to end."""
        for group in list(self._groups.values()):
            if group.state == "running":
                why = self._why_end(group)
                if why is not None:
                    self._end_later(group, why)
            elif group.state == "ending" and group.id not in self._ending:
                self._end_later(group, group.ended_why)  # stops that failed: again

    def _why_end(self, group: WorkerGroup) -> str | None:
        try:
            cell = self._cells.running_cell(group.kernel_id)
        except NotFound:
            return "its kernel is gone"
        if cell is None or cell.cell_id != group.cell_id:
            return f"cell {group.cell_id} ended"
        if all(worker.state == "exited" for worker in group.workers):
            return "all its workers exited"
        held = {host: set(devices) for host, devices in self._ledger.holds(group.id).items()}
        if held != {host: set(devices) for host, devices in group.holds().items()}:
            return "the GPU ledger no longer holds all its devices"
        for worker in group.workers:
            with contextlib.suppress(NotFound):
                if self._hosts.get(worker.host_id).alive:
                    continue
            return f"host {worker.host_id} was lost"
        return None

    def _end_later(self, group: WorkerGroup, why: str) -> asyncio.Task[WorkerGroup]:
        """The task that ends the group (started now, unless it is under way)."""
        ending = self._ending.get(group.id)
        if ending is None:
            ending = asyncio.create_task(self._ending_of(group, why))
            self._ending[group.id] = ending
        return ending

    async def _end(self, group: WorkerGroup, why: str) -> WorkerGroup:
        """Stop the group's workers, free its devices, keep its record; once per group."""
        if group.state == "ended":
            return group
        return await asyncio.shield(self._end_later(group, why))

    async def _ending_of(self, group: WorkerGroup, why: str) -> WorkerGroup:
        """Stop the workers not yet gone, releasing each one's devices as it goes; the group
        ends when all are gone, else stays ``ending`` (a report, a lost host or the next sweep
        finishes it)."""
        if group.state != "ending":
            group.state, group.ended_why = "ending", why
            log.info("kernel %s: tool workers %s end: %s", group.kernel_id, group.id, why)
        try:
            launching = self._launching.get(group.id)
            if launching is not None:  # deleted while it starts: what it launches is stopped
                await launching.wait()
            await asyncio.gather(
                *(self._stop_worker(group, w) for w in group.workers if not w.forgotten)
            )
        finally:
            self._ending.pop(group.id, None)
        self._finish_if_gone(group)
        return group

    async def _stop_worker(self, group: WorkerGroup, worker: ToolWorker) -> None:
        try:
            host = self._hosts.get(worker.host_id)
        except NotFound:
            self._release(group, worker, forgotten=True)
            return
        if not host.alive:
            self._release(group, worker, forgotten=True)
            return
        try:
            answer = await host.client.stop_worker(worker.id, self.grace)
            code = answer.get("exit_code")
            worker.exit_code = code if isinstance(code, int) else worker.exit_code
            worker.log_tail = await host.client.worker_log(worker.id, LOG_TAIL_LINES)
            await host.client.forget_worker(worker.id)
        except NotFound:
            pass  # never started there, or forgotten already
        except FleetError as e:
            log.warning("cannot stop tool worker %s on host %s (its GPUs stay held): %s",
                        worker.id, host.id, e)  # fmt: skip
            return
        self._release(group, worker, forgotten=True)

    def _release(self, group: WorkerGroup, worker: ToolWorker, forgotten: bool) -> None:
        """The worker is known gone: end the holds of its devices."""
        worker.state, worker.released = "exited", True
        worker.forgotten = worker.forgotten or forgotten
        freed = self._ledger.unhold(group.id, worker.host_id, worker.device_ids)
        if freed and self._jobs is not None:
            self._jobs.gpus_released()

    def _finish_if_gone(self, group: WorkerGroup) -> None:
        """End an ``ending`` group whose workers are all gone and forgotten by their agents
        (unless a stop is under way)."""
        if group.state != "ending" or group.id in self._ending:
            return
        if not all(worker.released and worker.forgotten for worker in group.workers):
            return
        group.state = "ended"
        self._forget_old(group.kernel_id)

    def _forget_old(self, kernel_id: str) -> None:
        ended = [g for g in self.groups(kernel_id) if g.state == "ended"]
        for group in ended[:-KEPT_ENDED]:
            del self._groups[group.id]

    # ---- host reports ----------------------------------------------------------------------

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        """Take the workers' states from the report; stop running workers no group knows."""
        reported = {str(w.get("id")): w for w in host.workers}
        known: set[str] = set()
        for group in list(self._groups.values()):
            for worker in group.workers:
                if group.state != "ended" and not worker.released:
                    known.add(worker.id)  # a late launch, or one a lost host kept, is a stray
                if worker.host_id != host.id:
                    continue
                if group.state == "ending" and group.id in self._launching:
                    continue  # not listed may mean not launched yet
                if group.state == "ending" and not worker.forgotten:
                    seen = reported.get(worker.id)
                    if seen is None or seen.get("state") == "exited":
                        # gone, though its stop failed: the sweep's retry forgets it there
                        self._release(group, worker, forgotten=seen is None)
                        self._finish_if_gone(group)
                    continue
                if group.state != "running":
                    continue
                seen = reported.get(worker.id)
                if seen is None:
                    if worker.state == "running" and restarted:
                        worker.state = "exited"  # its agent restarted: it is gone
                    continue
                worker.state = "exited" if seen.get("state") == "exited" else "running"
                code = seen.get("exit_code")
                worker.exit_code = code if isinstance(code, int) else None
        for worker_id, seen in reported.items():
            if worker_id not in known and seen.get("state") == "running":
                task = asyncio.get_running_loop().create_task(self._stop_stray(host, worker_id))
                self._strays.add(task)
                task.add_done_callback(self._strays.discard)
        if any(g.state == "running" for g in self._groups.values()):
            self.sweep()

    def on_host_lost(self, host: HostRecord) -> None:
        """End the groups with workers on the host; those workers count as gone (what the
        host still runs when it comes back is stopped as a stray)."""
        for group in list(self._groups.values()):
            if group.state == "ending":
                for worker in group.workers:
                    if worker.host_id == host.id and not worker.forgotten:
                        self._release(group, worker, forgotten=True)
                self._finish_if_gone(group)
            elif group.state == "running" and any(w.host_id == host.id for w in group.workers):
                self._end_later(group, f"host {host.id} was lost")

    async def _stop_stray(self, host: HostRecord, worker_id: str) -> None:
        log.warning("host %s runs tool worker %s, which no group knows: stopping it", host.id,
                    worker_id)  # fmt: skip
        with contextlib.suppress(FleetError):
            await host.client.stop_worker(worker_id, self.grace)
            await host.client.forget_worker(worker_id)

    # ---- internals -------------------------------------------------------------------------

    def _free_devices(self) -> tuple[dict[str, tuple[str, ...]], int]:
        """Host -> the devices workers could hold, on the hosts that take work; and how many
        GPUs those hosts have in all."""
        hosts = [h for h in self._hosts.all() if h.takes_work and h.id in self._ledger.hosts()]
        free = {host.id: self._ledger.holdable(host.id) for host in hosts}
        total = sum(self._ledger.view(host.id).total for host in hosts)
        return free, total

    def _new_group(
        self, kernel_id: str, cell_id: str, module: str, slots: list[WorkerSlot]
    ) -> WorkerGroup:
        group_id = f"wg-{self._new_id()}"
        while group_id in self._groups:
            group_id = f"wg-{self._new_id()}"
        workers = [
            ToolWorker(f"wrk-{group_id[3:]}-{index}", index, slot.host_id, slot.device_ids)
            for index, slot in enumerate(slots)
        ]
        return WorkerGroup(group_id, kernel_id, cell_id, module, workers)

    def _hold(self, group: WorkerGroup) -> tuple[str, ...]:
        """Hold the group's devices, all or nothing; the jobs whose loans that ended."""
        preempted: set[str] = set()
        try:
            for host_id, devices in group.holds().items():
                preempted.update(self._ledger.hold(host_id, devices, group.kernel_id, group.id))
        except FleetError:
            self._ledger.unhold(group.id)
            raise
        return tuple(sorted(preempted))

    async def _launch(
        self, group: WorkerGroup, worker: ToolWorker, request: WorkersRequest
    ) -> None:
        body = {
            "worker_id": worker.id,
            "kernel_id": group.kernel_id,
            "module": request.module,
            "args": [*request.args, *request.args_each[worker.index]],
            "devices": list(worker.device_ids),
            "env": request.env,
        }
        await self._hosts.get(worker.host_id).client.start_worker(body)
        worker.state = "running"
