"""Gavel's round-based mechanism: from an allocation (time shares) to who runs next round.

An allocation says job ``i`` should spend the share ``X[i, j]`` of its time on GPU type ``j``.
The mechanism realises it round by round. For every type it ranks the jobs by *priority*, the
allocated share over the share of that type's time the job has received so far:

    priority[i, j] = X[i, j] / (time[i, j] / sum_k time[k, j])

so a job behind its share moves up. Ties break on the job's *deficit* (time it should have had on
the type under earlier allocations minus time it had), then on the share itself. Types are walked
in order (shuffled each round for heterogeneity-agnostic policies, as Gavel does); each type takes
the highest-ranked jobs that fit in its GPUs left, a job running on at most one type per round and
on all its ``scale_factor`` GPUs there. Jobs with no share on a type come last and only fill GPUs
nobody else wants (unless ``fill_idle`` is off, as for FIFO, whose jobs keep to the type they
hold); a job absent from the allocation does not run at all.

The counters restart whenever the allocation changes, as in Gavel: each job's time per type goes
back to half a round (so a job that has not run yet still has a finite priority), and what each
job should have had under the old allocation minus what it had is added to its deficit. A job
that runs on the same type two rounds in a row keeps its lease (`RoundPlan.kept`).

Pure bookkeeping: no clock (``now`` comes from the snapshot), no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from kernelfleet.scheduler.jobs.model import Allocation, JobLease, JobsSnapshot, RoundPlan

UNRUN_PRIORITY = 1e9
"""Priority factor of a share when the type has not run anything yet (finite, so 2x > x)."""


class RoundScheduler:
    """Plans rounds from allocations and records what really ran.

    Call `plan` at the start of every round with the current snapshot and allocation, then
    `record` with how long each planned job really ran (a job that finished or was preempted
    mid-round ran less), and `forget` a job once it leaves for good. ``shuffle`` randomises the
    order GPU types are filled in each round (Gavel does it for agnostic policies); None keeps
    the snapshot's order. ``fill_idle=False`` runs a job only on types where its share is
    positive (Gavel's FIFO); policies say which they need in ``fills_idle_gpus``.
    """

    def __init__(self, shuffle: random.Random | None = None, fill_idle: bool = True) -> None:
        self.shuffle = shuffle
        self.fill_idle = fill_idle
        self.allocation: dict[str, dict[str, float]] | None = None
        self.reset_s = 0.0
        self.time_since_reset: dict[str, dict[str, float]] = {}
        self.type_time_since_reset: dict[str, float] = {}
        self.deficits: dict[str, dict[str, float]] = {}
        self.previous: Mapping[str, JobLease] = {}

    def plan(self, snapshot: JobsSnapshot, allocation: Allocation) -> RoundPlan:
        """The jobs to run next round, on which type and how many GPUs."""
        shares = {job: dict(per_type) for job, per_type in allocation.items()}
        head_start = snapshot.round_s / 2.0
        for job in snapshot.jobs:
            if job.job_id not in self.time_since_reset:
                self.time_since_reset[job.job_id] = dict.fromkeys(snapshot.gpu_types, head_start)
                self.deficits[job.job_id] = dict.fromkeys(snapshot.gpu_types, 0.0)
        if shares != self.allocation:
            self.restart_counters(snapshot, head_start)
            self.allocation = shares
        order = list(snapshot.gpu_types)
        if self.shuffle is not None:
            self.shuffle.shuffle(order)
        left = dict(snapshot.cluster)
        leases: dict[str, JobLease] = {}
        for gpu in order:
            for job_id in self.ranking(snapshot, shares, gpu):
                job = snapshot.job(job_id)
                if job_id in leases or job.scale_factor > left[gpu]:
                    continue
                leases[job_id] = JobLease(gpu, job.scale_factor)
                left[gpu] -= job.scale_factor
        kept = frozenset(job for job, lease in leases.items() if self.previous.get(job) == lease)
        return RoundPlan(leases=leases, kept=kept)

    def priority(self, job_id: str, gpu: str, share: float) -> float:
        """Share over the fraction of the type's time the job has had since the last restart."""
        type_time = self.type_time_since_reset.get(gpu, 0.0)
        job_time = self.time_since_reset.get(job_id, {}).get(gpu, 0.0)
        if share <= 0.0:
            return 0.0
        if type_time <= 0.0 or job_time <= 0.0:
            return share * UNRUN_PRIORITY
        return share / (job_time / type_time)

    def ranking(
        self, snapshot: JobsSnapshot, shares: Mapping[str, Mapping[str, float]], gpu: str
    ) -> list[str]:
        """The jobs that may run on ``gpu``, best first: priority, then deficit, then share."""
        entries = []
        for job in snapshot.jobs:
            if job.job_id not in shares or not job.can_run_on(gpu):
                continue
            share = shares[job.job_id].get(gpu, 0.0)
            if share <= 0.0 and not self.fill_idle:
                continue
            deficit = self.deficits.get(job.job_id, {}).get(gpu, 0.0)
            entries.append((self.priority(job.job_id, gpu, share), deficit, share, job.job_id))
        entries.sort(key=lambda entry: entry[:3], reverse=True)
        return [entry[3] for entry in entries]

    def restart_counters(self, snapshot: JobsSnapshot, head_start: float) -> None:
        """A new allocation: fold what each job missed under the old one into its deficit."""
        elapsed = max(snapshot.now_s - self.reset_s, 0.0)
        old = self.allocation or {}
        self.type_time_since_reset = dict.fromkeys(snapshot.gpu_types, 0.0)
        for job_id, per_type in self.time_since_reset.items():
            deficits = self.deficits.setdefault(job_id, {})
            for gpu in snapshot.gpu_types:
                received = per_type.get(gpu, head_start) - head_start
                owed = old.get(job_id, {}).get(gpu, 0.0) * elapsed
                deficits[gpu] = deficits.get(gpu, 0.0) + owed - received
                per_type[gpu] = head_start
                self.type_time_since_reset[gpu] += head_start
        self.reset_s = snapshot.now_s

    def record(self, plan: RoundPlan, ran_s: Mapping[str, float]) -> None:
        """After a round: ``ran_s`` is how long each planned job really ran."""
        for job_id, lease in plan.leases.items():
            seconds = max(ran_s.get(job_id, 0.0), 0.0)
            if job_id not in self.time_since_reset:
                continue
            per_type = self.time_since_reset[job_id]
            per_type[lease.gpu_type] = per_type.get(lease.gpu_type, 0.0) + seconds
            self.type_time_since_reset[lease.gpu_type] = (
                self.type_time_since_reset.get(lease.gpu_type, 0.0) + seconds
            )
        self.previous = {
            job_id: lease for job_id, lease in plan.leases.items() if ran_s.get(job_id, 0.0) > 0
        }

    def forget(self, job_id: str) -> None:
        """The job left (finished, cancelled): drop its counters."""
        self.time_since_reset.pop(job_id, None)
        self.deficits.pop(job_id, None)
        self.previous = {job: lease for job, lease in self.previous.items() if job != job_id}
