"""The job-policy interface and its entry-point registry (group ``kernelfleet.job_policies``)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import ClassVar

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.jobs.model import Allocation, JobsSnapshot

ENTRY_POINT_GROUP = "kernelfleet.job_policies"


class SolverFailed(Exception):
    """A policy's solver gave no usable answer (infeasible, timed out, numerical trouble).

    ``reason`` says which, in words a log line can carry.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JobPolicy(abc.ABC):
    """Decides how jobs share the GPUs lent to them. Pure: no I/O, no clock, no state that
    `allocate` depends on beyond what the snapshot holds (a policy may keep a plan it made, as
    Shockwave does, but must decide correctly from a snapshot alone).
    """

    name: ClassVar[str]
    replans_every_round: ClassVar[bool] = False
    """False: the caller re-allocates only when the set of jobs or GPUs changes (Gavel)."""

    @abc.abstractmethod
    def allocate(self, snapshot: JobsSnapshot) -> Allocation:
        """The share of time each job should get on each GPU type; raises `SolverFailed`."""


@dataclass(frozen=True)
class PolicyDecision:
    """An allocation and who made it: ``fallback_reason`` is set when the fallback policy ran."""

    allocation: Allocation
    policy: str
    fallback_reason: str | None = None


def decide(policy: JobPolicy, fallback: JobPolicy, snapshot: JobsSnapshot) -> PolicyDecision:
    """`policy`'s allocation, or `fallback`'s with the reason when `policy`'s solver failed."""
    try:
        return PolicyDecision(policy.allocate(snapshot), policy.name)
    except SolverFailed as failure:
        return PolicyDecision(fallback.allocate(snapshot), fallback.name, failure.reason)


def available_job_policies() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_job_policy(name: str, **options: object) -> JobPolicy:
    """The registered job policy `name`, built with `options`; `InvalidRequest` if unknown."""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        known = ", ".join(available_job_policies()) or "none"
        raise InvalidRequest(f"unknown job policy {name!r} (known: {known})")
    policy_class = matches[0].load()
    policy = policy_class(**options)
    if not isinstance(policy, JobPolicy):
        raise InvalidRequest(f"job policy {name!r} is not a JobPolicy")
    return policy
