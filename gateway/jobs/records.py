"""One background job as the gateway keeps it: its state machine, its admin model, its stored form.

States (``JobState``)::

    queued ──▶ running ──▶ stopping ──▶ queued      (preempted by a cell or by the scheduler)
      │           │           ├──────▶ cancelled   (a cancel stopped it)
      │           │           ├──────▶ completed   (it reached its budget as it stopped)
      │           │           └──────▶ failed
      │           ├──▶ completed / failed          (its process exited on its own)
      │           └──▶ queued                      (its host was lost: it resumes elsewhere)
      └──▶ cancelled
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from kernelfleet.states import Transitions, check_transition

LOG_TAIL_LINES = 20


class JobState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


_J = JobState
JOB_TRANSITIONS: Transitions[JobState] = {
    _J.QUEUED: frozenset({_J.RUNNING, _J.CANCELLED}),
    _J.RUNNING: frozenset({_J.STOPPING, _J.COMPLETED, _J.FAILED, _J.QUEUED}),
    _J.STOPPING: frozenset({_J.QUEUED, _J.CANCELLED, _J.COMPLETED, _J.FAILED}),
    _J.COMPLETED: frozenset(),
    _J.FAILED: frozenset(),
    _J.CANCELLED: frozenset(),
}


@dataclass(frozen=True)
class JobLease:
    """The concrete devices a running job holds: ``devices`` of host ``host``."""

    host: str
    gpu_type: str
    devices: tuple[str, ...]

    def model(self) -> dict[str, Any]:
        return {"host": self.host, "gpu_type": self.gpu_type, "devices": list(self.devices)}


def new_job_id() -> str:
    return f"job-{secrets.token_hex(4)}"


def iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()


@dataclass
class JobRecord:
    """A job: what was submitted, where it runs, how far it got. Times are epoch seconds."""

    id: str
    name: str
    gpus: int
    steps: int
    source: str | None = None
    function: str | None = None
    """base64 of the cloudpickle of a zero-argument callable (instead of `source`)."""
    args: list[str] = field(default_factory=list)
    weight: float = 1.0
    owner_kernel: str | None = None
    state: JobState = JobState.QUEUED
    steps_done: int = 0
    checkpoint_step: int = 0
    """The step of its last checkpoint: where a killed job resumes."""
    throughput: dict[str, float] = field(default_factory=dict)
    time_on: dict[str, float] = field(default_factory=dict)
    """Seconds run so far per GPU type."""
    lease: JobLease | None = None
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    lost_steps: int = 0
    restarts: int = 0
    exit_code: int | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    """Why it is stopping: ``"preempted"`` (resume later) or ``"cancelled"``."""
    run_since: float | None = None
    """When its current run began (not stored: a restarted gateway counts from its start)."""

    def move_to(self, state: JobState) -> None:
        self.state = check_transition(JOB_TRANSITIONS, f"job {self.id}", self.state, state)

    def model(self) -> dict[str, Any]:
        """The job record of the admin API (docs/jobs.md)."""
        return {
            "id": self.id,
            "name": self.name,
            "owner_kernel": self.owner_kernel,
            "state": self.state.value,
            "gpus": self.gpus,
            "steps": self.steps,
            "steps_done": self.steps_done,
            "weight": self.weight,
            "throughput": dict(self.throughput),
            "lease": None if self.lease is None else self.lease.model(),
            "submitted_at": iso(self.submitted_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "preemptions": self.preemptions,
            "lost_steps": self.lost_steps,
            "restarts": self.restarts,
            "exit_code": self.exit_code,
            "error": self.error,
            "log_tail": list(self.log_tail[-LOG_TAIL_LINES:]),
        }

    def stored(self) -> dict[str, Any]:
        """What ``jobs.json`` keeps of it (everything but `run_since`)."""
        data = asdict(self)
        data["state"] = self.state.value
        data.pop("run_since")
        return data

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> JobRecord:
        """The inverse of `stored`; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        data = dict(data)
        data["state"] = JobState(data["state"])
        lease = data.get("lease")
        data["lease"] = (
            None
            if lease is None
            else JobLease(lease["host"], lease["gpu_type"], tuple(lease["devices"]))
        )
        return cls(**data)
