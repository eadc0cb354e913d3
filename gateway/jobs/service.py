"""The jobs service: the job table, its scheduling rounds, and cells first.

**Rounds.** Every ``round_s`` seconds (sooner when a job is submitted or ends), the service
takes the GPUs no cell holds on the alive hosts (the pool: devices lendable now, plus those
lent to running jobs), asks the job policy for an allocation (`decide`: the fallback policy,
``max_min_fairness``, when the policy's solver fails; the reason is logged), turns it into the
round's plan (`RoundScheduler.plan`), places the plan on concrete devices
(`kernelfleet.scheduler.jobs.placement.place`), then stops the running jobs the plan moves or
leaves out and starts the placed ones, through their host agents. Devices a job runs on are
lent to it in the GPU ledger.

**Cells first.** A cell whose commitment takes devices lent to jobs calls `preempt` (through
`ExecutorChooser`), which stops those jobs (SIGTERM, ``grace``, SIGKILL) and returns once their
processes exited; the jobs are queued again and resume from their last checkpoint. When cells
release GPUs (`gpus_released`) while a job waits, a round comes ``resume_after_s`` later (one at
a time), not a whole ``round_s`` later: a preempted job does not sit out a round for a cell of a
few seconds, and a notebook that runs cells in a burst does not restart it between each two.

**Exits.** A job process's exit reaches the gateway in its host's report (the agent beats at
once) or as the answer to a stop: exit 0 without a stop request is ``completed``; exit 0 after
one is a preemption (``queued``, or ``completed`` when the budget was reached); a kill after the
grace loses the steps since the last checkpoint (``lost_steps``); any other exit is
``failed``, with its log tail in ``error``.

**Persistence.** ``jobs.json`` (`JobStore`) after every change. A restarted gateway lists the
jobs at once; a job that was running is re-linked when its host reports it running (its devices
are lent to it again), handled as exited when the host reports it exited, and queued again
(its steps since the last checkpoint lost) when the host reports without it or is not back
within ``relink_grace`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import shutil
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from kernelfleet.errors import Conflict, FleetError, InvalidRequest, NotFound
from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.jobs.planning import ThroughputMeter, pool_of, snapshot_of
from kernelfleet.gateway.jobs.records import JobLease, JobRecord, JobState, new_job_id
from kernelfleet.gateway.jobs.store import JobStore
from kernelfleet.gateway.jobs.submission import Submission
from kernelfleet.gateway.jobs.tokens import JobTokens
from kernelfleet.gateway.jobs.whatif import what_if
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.protocol import JobEnv
from kernelfleet.scheduler.jobs.model import RoundPlan
from kernelfleet.scheduler.jobs.placement import HostDevices, Placement, lease_speed, place
from kernelfleet.scheduler.jobs.policy import (
    JobPolicy,
    available_job_policies,
    decide,
    load_job_policy,
)
from kernelfleet.scheduler.jobs.rounds import RoundScheduler

log = logging.getLogger("kernelfleet.gateway.jobs")

FALLBACK_POLICY = "max_min_fairness"


class JobService:
    """The jobs of the fleet; see the module docstring. Everything runs on the event loop."""

    def __init__(
        self,
        hosts: HostRegistry,
        ledger: GpuLedger,
        store: JobStore,
        tokens: JobTokens,
        *,
        policy: str = FALLBACK_POLICY,
        round_s: float = 360.0,
        grace: float = 30.0,
        checkpoint_root: str | Path = "",
        relink_grace: float = 60.0,
        resume_after_s: float = 30.0,
    ) -> None:
        self._hosts = hosts
        self._ledger = ledger
        self._store = store
        self._tokens = tokens
        self.round_s = round_s
        self.grace = grace
        self.relink_grace = relink_grace
        self.resume_after_s = resume_after_s
        self._resume: asyncio.TimerHandle | None = None
        self._checkpoint_root = Path(checkpoint_root)
        self._jobs: dict[str, JobRecord] = {}
        self._policy: JobPolicy = load_job_policy(policy)
        self._fallback: JobPolicy = load_job_policy(FALLBACK_POLICY)
        self._rounds = RoundScheduler()
        self._plan: RoundPlan | None = None
        self._round_began = time.monotonic()
        self._ran: dict[str, float] = {}
        self._meters: dict[str, ThroughputMeter] = {}
        self._stops: dict[str, asyncio.Task[None]] = {}
        self._unlinked: set[str] = set()
        self._restored_at = time.monotonic()
        self._wake: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        hosts.observe(self)

    # ---- reading ---------------------------------------------------------------------------

    @property
    def policy(self) -> str:
        return self._policy.name

    def get(self, job_id: str) -> JobRecord:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise NotFound(f"no job {job_id!r}") from None

    def all(self) -> list[JobRecord]:
        """Every job, oldest first."""
        return list(self._jobs.values())

    def summary(self) -> dict[str, int]:
        """``GET /api/fleet``'s ``jobs``: queued and running jobs, GPUs lent to jobs."""
        states = [job.state for job in self._jobs.values()]
        lent = sum(len(self._ledger.lent(h)) for h in self._ledger.hosts())
        return {
            "queued": states.count(JobState.QUEUED),
            "running": states.count(JobState.RUNNING) + states.count(JobState.STOPPING),
            "gpus_lent": lent,
        }

    def host_type(self, host_id: str) -> str:
        with contextlib.suppress(NotFound):
            return self._hosts.get(host_id).gpu_type
        return "none"

    # ---- the admin API ---------------------------------------------------------------------

    def submit(self, body: Mapping[str, Any], owner_kernel: str | None) -> JobRecord:
        """A new queued job from the body of ``POST /api/fleet/jobs``; `InvalidRequest` for
        bad fields, `Conflict` (``never-fits``) when no host has that many GPUs."""
        submission = Submission.from_json(body)
        largest = max(
            ((len(host.gpus), host.id) for host in self._hosts.all() if host.alive),
            default=(0, "none"),
        )
        if submission.gpus > largest[0]:
            raise Conflict(
                f"no host can ever give {submission.gpus} GPUs: the largest host "
                f"({largest[1]}) has {largest[0]}",
                reason="never-fits",
            )
        job_id = new_job_id()
        job = JobRecord(
            id=job_id,
            name=submission.name or job_id,
            gpus=submission.gpus,
            steps=submission.steps,
            source=submission.source,
            function=submission.function,
            args=list(submission.args),
            weight=submission.weight,
            owner_kernel=owner_kernel,
            submitted_at=time.time(),
        )
        self._jobs[job.id] = job
        log.info("job %s (%s) submitted: %d GPU(s), %d steps", job.id, job.name, job.gpus,
                 job.steps)  # fmt: skip
        self._changed(wake=True)
        return job

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job (stopped first if it runs: SIGTERM, grace, SIGKILL); answers once it is
        cancelled. Who may is the handler's business (`JobRecord.owner_kernel`)."""
        job = self.get(job_id)
        if job.state.finished:
            return job
        if job.state is JobState.QUEUED:
            self._finish(job, JobState.CANCELLED)
            return job
        await self._stop(job, "cancelled")
        return job

    async def logs(self, job_id: str, tail: int) -> list[str]:
        """The last `tail` lines of the job's output: from its host while it has one, else the
        tail kept from its last run."""
        job = self.get(job_id)
        if job.lease is not None:
            with contextlib.suppress(FleetError):
                return await self._hosts.get(job.lease.host).client.job_log(job.id, tail)
        return job.log_tail[-tail:] if tail > 0 else []

    def progress(self, job_id: str, body: Mapping[str, Any]) -> JobRecord:
        """A job's report (`kernelfleet.jobs.sdk`): steps done, maybe its own throughput and
        the step of a checkpoint it just saved."""
        job = self.get(job_id)
        steps = _count(body, "steps_done", job.steps_done)
        checkpoint = _count(body, "checkpoint_step", job.checkpoint_step)
        measured = body.get("throughput")
        if measured is not None and (isinstance(measured, bool) or not isinstance(
                measured, int | float) or measured < 0):  # fmt: skip
            raise InvalidRequest("'throughput' must be a non-negative number of steps/s")
        if job.state.finished:
            return job
        job.steps_done, job.checkpoint_step = steps, checkpoint
        if job.lease is not None:
            meter = self._meters.setdefault(job.id, ThroughputMeter())
            speed = lease_speed(job.lease.devices, self._speeds(job.lease.host))
            figure = meter.report(job.lease.gpu_type, steps, measured, speed=speed)
            if figure is not None:
                job.throughput[job.lease.gpu_type] = round(figure, 4)
        self._changed()
        return job

    def check_job_token(self, job_id: str, token: str) -> bool:
        """Whether `token` is job `job_id`'s own (an unknown job has none)."""
        return job_id in self._jobs and self._tokens.verify(token, job_id)

    def set_policy(self, name: str) -> str:
        """Use job policy `name` from the next round; `InvalidRequest` if unknown."""
        self._policy = load_job_policy(name)
        log.info("job policy is now %s", name)
        self._changed(wake=True)
        return self._policy.name

    @staticmethod
    def available_policies() -> list[str]:
        return available_job_policies()

    async def simulate(self, policies: list[str] | None) -> dict[str, dict[str, Any]]:
        """What-if of the jobs not finished yet under each of `policies` (default: the current
        one), with the job simulator, on the GPUs no cell holds now (every GPU of the alive
        hosts when cells hold them all) and the throughputs learned so far. Runs in a thread:
        the LPs must not stall the event loop."""
        chosen = [load_job_policy(name) for name in policies or [self._policy.name]]
        cluster = pool_of(self._pool()) or self._all_gpus()
        jobs = [copy.deepcopy(job) for job in self._jobs.values()]  # a stable copy for the thread
        return await asyncio.to_thread(what_if, jobs, cluster, chosen, self.round_s, self._fallback)

    def _all_gpus(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for host in self._hosts.all():
            if host.alive and host.gpus:
                counts[host.gpu_type] = counts.get(host.gpu_type, 0) + len(host.gpus)
        return counts

    # ---- cells first -----------------------------------------------------------------------

    async def preempt(self, job_ids: tuple[str, ...], why: str) -> None:
        """Stop those jobs (their devices were taken by a cell) and queue them again; returns
        once their processes exited. Never raises: the cell goes on in any case."""
        stops = []
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is None or job.state.finished:
                continue
            log.info("job %s preempted: %s", job_id, why)
            stops.append(self._stop(job, "preempted"))
        for failure in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(failure, BaseException):
                log.warning("a preempted job did not stop cleanly: %s", failure)

    def gpus_released(self) -> None:
        """Cells released GPUs: if a job waits, a round in ``resume_after_s`` (see the module
        docstring); a round already due then is not moved."""
        waiting = any(job.state is JobState.QUEUED for job in self._jobs.values())
        if not waiting or self._resume is not None or self._wake is None:
            return

        def wake() -> None:
            self._resume = None
            if self._wake is not None:
                self._wake.set()

        self._resume = asyncio.get_running_loop().call_later(self.resume_after_s, wake)

    # ---- host reports ----------------------------------------------------------------------

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        reported = {str(job.get("id")): job for job in host.jobs if isinstance(job, dict)}
        for job in list(self._jobs.values()):
            if job.lease is None or job.lease.host != host.id or job.id in self._stops:
                continue
            seen = reported.get(job.id)
            if seen is not None and seen.get("state") == "running":
                if job.id in self._unlinked:
                    self._relink(job)
                continue
            if seen is not None and job.state is JobState.RUNNING:
                code = seen.get("exit_code")
                self._ended(job, code if isinstance(code, int) else None, False)
            elif seen is None and (restarted or job.id in self._unlinked):
                self._lost(job, f"host {host.id} no longer runs it")
        for job_id, seen in reported.items():
            known = self._jobs.get(job_id)
            if (
                seen.get("state") == "running"
                and job_id not in self._stops
                and (known is None or known.lease is None or known.lease.host != host.id)
            ):
                self._later(self._stop_stray(host, job_id))

    async def _stop_stray(self, host: HostRecord, job_id: str) -> None:
        """A job process its host runs that the job table does not place there (its host was
        taken for lost while its agent restarted, say, and the job resumed elsewhere): stop it
        and have the agent forget it, so no two processes of one job write its checkpoints."""
        log.warning("host %s runs job %s, which is not placed there: stopping it", host.id,
                    job_id)  # fmt: skip
        with contextlib.suppress(FleetError):
            await host.client.stop_job(job_id, self.grace)
            await host.client.forget_job(job_id)

    def on_host_lost(self, host: HostRecord) -> None:
        for job in list(self._jobs.values()):
            if job.lease is not None and job.lease.host == host.id and job.id not in self._stops:
                self._lost(job, f"host {host.id} was lost")

    # ---- persistence -----------------------------------------------------------------------

    def restore(self) -> int:
        """Take the jobs a previous gateway left (`JobStore`); `StateUnreadable` propagates."""
        jobs, policy = self._store.load()
        if policy is not None and policy in available_job_policies():
            self._policy = load_job_policy(policy)
        for job in jobs:
            if job.state is JobState.STOPPING:
                job.state = JobState.RUNNING  # its stop's answer went to the dead gateway
            if job.state is JobState.RUNNING:
                self._unlinked.add(job.id)
            self._jobs[job.id] = job
        self._restored_at = time.monotonic()
        if jobs:
            log.info("%d job(s) restored, %d to re-link", len(jobs), len(self._unlinked))
        return len(jobs)

    # ---- the scheduling loop ---------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Scheduling rounds until `stop`."""
        self._wake = asyncio.Event()
        while not stop.is_set():
            try:
                await self.schedule_round()
            except Exception:
                log.exception("a job scheduling round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.round_s)
            self._wake.clear()

    async def schedule_round(self) -> None:
        """One round (see the module docstring). None while jobs of a previous gateway wait
        to be re-linked: their devices look free until their hosts report them."""
        self._give_up_unlinked()
        if self._unlinked:
            return
        now = time.monotonic()
        if self._plan is not None:
            ran = {job_id: self._ran.get(job_id, 0.0) for job_id in self._plan.leases}
            for job in self._jobs.values():
                if job.state is JobState.RUNNING and job.id in ran and job.run_since is not None:
                    ran[job.id] += now - max(job.run_since, self._round_began)
            self._rounds.record(self._plan, ran)
        self._round_began, self._ran = now, {}
        pool = self._pool()
        cluster = pool_of(pool)
        snapshot = snapshot_of(self._jobs.values(), cluster, self.round_s, time.time())
        if not snapshot.jobs or not cluster:
            self._plan = None
            return
        decision = decide(self._policy, self._fallback, snapshot)
        if decision.fallback_reason is not None:
            log.warning("job policy %s failed (%s): %s decided this round",
                        self._policy.name, decision.fallback_reason, decision.policy)  # fmt: skip
        self._plan = plan = self._rounds.plan(snapshot, decision.allocation)
        current = {
            job.id: Placement(job.lease.host, job.lease.gpu_type, job.lease.devices)
            for job in self._jobs.values()
            if job.state is JobState.RUNNING and job.lease is not None
        }
        placed = place(plan, pool, current)
        moved = [self._jobs[j] for j, where in current.items() if placed.get(j) != where]
        await asyncio.gather(*(self._stop(job, "preempted") for job in moved))
        starting = [
            (self._jobs[j], where)
            for j, where in placed.items()
            if self._jobs[j].state is JobState.QUEUED
        ]
        await asyncio.gather(*(self._start(job, where) for job, where in starting))

    def _pool(self) -> list[HostDevices]:
        """Devices no cell holds on the alive hosts: lendable, or lent to a running job."""
        pool = []
        for host in self._hosts.all():
            if not host.takes_work or host.id not in self._ledger.hosts():
                continue
            lent = self._ledger.lent(host.id)
            running = {
                device
                for device, job_id in lent.items()
                if self._jobs.get(job_id) is not None
                and self._jobs[job_id].state is JobState.RUNNING
            }
            free = set(self._ledger.lendable(host.id)) | running
            devices = tuple(d for d in self._ledger.view(host.id).device_ids if d in free)
            speeds = self._ledger.speeds(host.id)
            pool.append(
                HostDevices(host.id, host.gpu_type, devices, tuple(speeds[d] for d in devices))
            )
        return pool

    def _speeds(self, host_id: str) -> dict[str, float]:
        """The relative speeds of the host's devices; none for a host the ledger lost."""
        return self._ledger.speeds(host_id) if host_id in self._ledger.hosts() else {}

    # ---- starting and stopping -------------------------------------------------------------

    async def _start(self, job: JobRecord, where: Placement) -> None:
        try:
            self._ledger.lend(where.host, where.devices, job.id)
        except FleetError as e:
            log.info("job %s waits: %s", job.id, e)
            return
        job.move_to(JobState.RUNNING)
        job.lease = JobLease(where.host, where.gpu_type, where.devices)
        if job.started_at is None:
            job.started_at = time.time()
        else:
            job.restarts += 1
        job.run_since, job.stop_reason, job.exit_code = time.monotonic(), None, None
        self._meters.setdefault(job.id, ThroughputMeter()).started(job.steps_done)
        self._changed()
        body: dict[str, Any] = {
            "job_id": job.id,
            "devices": list(where.devices),
            "args": list(job.args),
            "env": {
                JobEnv.JOB_TOKEN.value: self._tokens.issue(job.id),
                JobEnv.STEPS.value: str(job.steps),
                JobEnv.CHECKPOINT.value: str(self.checkpoint_folder(job.id)),
            },
        }
        body["function" if job.function is not None else "source"] = job.function or job.source
        try:
            await self._hosts.get(where.host).client.start_job(body)
        except FleetError as e:
            log.warning("job %s could not start on host %s: %s", job.id, where.host, e)
            if job.state is JobState.RUNNING and job.id not in self._stops:
                self._end_run(job)
                job.move_to(JobState.QUEUED)
                self._changed()
            return
        log.info("job %s runs on host %s, device(s) %s", job.id, where.host,
                 ",".join(where.devices))  # fmt: skip

    async def _stop(self, job: JobRecord, reason: str) -> None:
        """Stop a running job for `reason` (``preempted``, ``cancelled``); concurrent callers
        share one stop. Returns once its process exited (or its host is gone)."""
        running = self._stops.get(job.id)
        if running is None:
            if job.state is not JobState.RUNNING:
                return
            job.move_to(JobState.STOPPING)
            job.stop_reason = reason
            self._changed()
            running = self._stops[job.id] = asyncio.create_task(self._stopping(job))
        elif reason == "cancelled":
            job.stop_reason = reason
        await asyncio.shield(running)

    async def _stopping(self, job: JobRecord) -> None:
        assert job.lease is not None
        try:
            answer = await self._hosts.get(job.lease.host).client.stop_job(job.id, self.grace)
        except FleetError as e:
            log.warning("job %s: its host did not answer the stop (%s)", job.id, e)
            answer = {"exit_code": None, "killed": True}
        finally:
            self._stops.pop(job.id, None)
        code = answer.get("exit_code")
        self._ended(job, code if isinstance(code, int) else None, bool(answer.get("killed")))

    def _ended(self, job: JobRecord, code: int | None, killed: bool) -> None:
        """Its process exited with `code` (None: unknown); decide what the job is now."""
        host = job.lease.host if job.lease is not None else None
        self._unlinked.discard(job.id)
        self._end_run(job)
        job.exit_code = code
        reason, job.stop_reason = job.stop_reason, None
        killed = killed or (reason is not None and code is not None and code < 0)
        if killed:  # SIGKILL after the grace, or SIGTERM before the job could catch it
            self._lose_since_checkpoint(job)
        if reason == "cancelled":
            self._finish(job, JobState.CANCELLED)
        elif code == 0 and (reason is None or job.steps_done >= job.steps):
            self._finish(job, JobState.COMPLETED)
        elif reason == "preempted" and (code == 0 or killed):
            job.preemptions += 1
            job.move_to(JobState.QUEUED)
            self._changed(wake=True)
        elif code is None and not killed and job.steps_done >= job.steps:
            self._finish(job, JobState.COMPLETED)  # an adopted process that reached its budget
        elif code is None and not killed:
            self._lose_since_checkpoint(job)  # an adopted process: its fate is unknown
            job.move_to(JobState.QUEUED)
            self._changed(wake=True)
        else:
            job.error = f"the job's process exited with code {code}"
            self._finish(job, JobState.FAILED)
        if host is not None:
            self._later(self._collect(job, host))

    async def _collect(self, job: JobRecord, host_id: str) -> None:
        """Keep the log tail of the run that ended, then have its agent forget it."""
        try:
            client = self._hosts.get(host_id).client
            tail = await client.job_log(job.id, 20)
            job.log_tail = tail
            if job.state is JobState.FAILED and tail:
                job.error = f"{job.error}; its output ended with:\n" + "\n".join(tail)
            self._changed()
            await client.forget_job(job.id)
        except FleetError as e:
            log.info("job %s: its log could not be collected from %s: %s", job.id, host_id, e)

    def _lost(self, job: JobRecord, why: str) -> None:
        """Its run is gone without an exit code (its host was lost, or forgot it)."""
        log.warning("job %s lost its run: %s; it resumes from its last checkpoint", job.id, why)
        self._unlinked.discard(job.id)
        self._end_run(job)
        self._lose_since_checkpoint(job)
        job.move_to(JobState.QUEUED)
        self._changed(wake=True)

    def _relink(self, job: JobRecord) -> None:
        assert job.lease is not None
        self._unlinked.discard(job.id)
        try:
            self._ledger.lend(job.lease.host, job.lease.devices, job.id)
        except FleetError as e:  # a cell took its devices meanwhile: cells first
            log.info("job %s re-linked but its devices are taken (%s): stopping it", job.id, e)
            self._later(self._stop(job, "preempted"))
        job.run_since = time.monotonic()
        self._meters.setdefault(job.id, ThroughputMeter()).started(job.steps_done)
        log.info("job %s re-linked on host %s", job.id, job.lease.host)
        reason, job.stop_reason = job.stop_reason, None
        if reason is not None:  # the previous gateway was stopping it: finish what it began
            self._later(self._stop(job, reason))

    def _give_up_unlinked(self) -> None:
        if not self._unlinked or time.monotonic() - self._restored_at < self.relink_grace:
            return
        for job_id in sorted(self._unlinked):
            if self._jobs[job_id].state is not JobState.RUNNING:
                self._unlinked.discard(job_id)
                continue
            self._lost(self._jobs[job_id], f"its host did not report it within "
                       f"{self.relink_grace:g} s of the restart")  # fmt: skip

    def _end_run(self, job: JobRecord) -> None:
        """Account the run that ends and give its devices back."""
        now = time.monotonic()
        if job.run_since is not None and job.lease is not None:
            gpu_type = job.lease.gpu_type
            job.time_on[gpu_type] = job.time_on.get(gpu_type, 0.0) + now - job.run_since
            self._ran[job.id] = (
                self._ran.get(job.id, 0.0) + now - max(job.run_since, self._round_began)
            )
        job.run_since = None
        job.lease = None
        self._ledger.reclaim(job.id)

    @staticmethod
    def _lose_since_checkpoint(job: JobRecord) -> None:
        lost = max(0, job.steps_done - job.checkpoint_step)
        job.lost_steps += lost
        job.steps_done = job.checkpoint_step

    def _finish(self, job: JobRecord, state: JobState) -> None:
        if job.lease is not None:
            self._end_run(job)
        job.move_to(state)
        job.finished_at = time.time()
        self._meters.pop(job.id, None)
        self._rounds.forget(job.id)
        folder = self.checkpoint_folder(job.id)
        shutil.rmtree(folder, ignore_errors=True)
        log.info("job %s %s", job.id, state.value)
        self._changed(wake=True)

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def checkpoint_folder(self, job_id: str) -> Path:
        """The job's checkpoint folder in the object store (`JobEnv.CHECKPOINT`)."""
        return self._checkpoint_root / job_id

    def _changed(self, wake: bool = False) -> None:
        self._store.save(self.all(), self._policy.name)
        if wake and self._wake is not None:
            self._wake.set()


def _count(body: Mapping[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(f"'{name}' must be a non-negative integer")
    return value
