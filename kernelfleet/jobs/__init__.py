"""Background training jobs on the fleet's idle GPUs, from a notebook.

::

    from kernelfleet import jobs

    job = jobs.submit("train.py", gpus=2, steps=20000)  # or a function of no arguments
    jobs.status()        # every job: state, GPUs, progress, throughput, lease, preemptions
    jobs.job(job.id)     # one job; ids may be shortened while unambiguous
    jobs.logs(job.id, tail=50)
    jobs.cancel(job.id)  # only this kernel's own jobs
    jobs.policy()        # the job policy; jobs.policy("max_min_fairness") changes it
    jobs.simulate(["fifo", "max_min_fairness"])  # what-if of the current queue

The functions here use `JobsClient.from_environment()`, the client of the kernel the code runs
in (its kernel token); elsewhere build a `JobsClient` over a `kernelfleet.client.FleetClient`
with a URL and a token. ``%schedule`` is the magic over the same calls. The job process's side
(reporting progress, checkpoints, stopping) is `kernelfleet.jobs.sdk`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from kernelfleet.jobs.client import AmbiguousJobId, JobsClient
from kernelfleet.jobs.records import Job, JobLogs, JobPolicy, JobsStatus, Lease, Simulation

__all__ = [
    "AmbiguousJobId",
    "Job",
    "JobLogs",
    "JobPolicy",
    "JobsClient",
    "JobsStatus",
    "Lease",
    "Simulation",
    "cancel",
    "job",
    "logs",
    "policy",
    "simulate",
    "status",
    "submit",
]


def submit(
    target: str | os.PathLike[str] | Callable[[], Any],
    *,
    gpus: int,
    steps: int,
    name: str | None = None,
    weight: float | None = None,
    args: Sequence[str] = (),
) -> Job:
    """Queue a script (its path) or a function of no arguments as a job (`JobsClient.submit`)."""
    return JobsClient.from_environment().submit(
        target, gpus=gpus, steps=steps, name=name, weight=weight, args=args
    )


def status() -> JobsStatus:
    """Every job and the job policy (`JobsClient.status`)."""
    return JobsClient.from_environment().status()


def job(job_id: str) -> Job:
    """One job's record (`JobsClient.job`)."""
    return JobsClient.from_environment().job(job_id)


def cancel(job_id: str) -> Job:
    """Cancel one of this kernel's jobs (`JobsClient.cancel`)."""
    return JobsClient.from_environment().cancel(job_id)


def logs(job_id: str, tail: int | None = None) -> JobLogs:
    """A job's last output lines (`JobsClient.logs`)."""
    return JobsClient.from_environment().logs(job_id, tail)


def policy(name: str | None = None) -> JobPolicy:
    """The job policy, set to `name` first when given (`JobsClient.policy`)."""
    return JobsClient.from_environment().policy(name)


def simulate(policies: Sequence[str] | None = None) -> Simulation:
    """What-if of the current queue under `policies` (`JobsClient.simulate`)."""
    return JobsClient.from_environment().simulate(policies)
