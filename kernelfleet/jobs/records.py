"""The job library's answers: small frozen records read from the admin API's JSON.

Each ``from_json`` reads what ``/api/fleet/jobs`` answers (docs/jobs.md has the job record);
a field the gateway leaves out gets its empty value, never an error. Each record shows itself
in a notebook: ``_repr_html_`` for JupyterLab, a plain-text ``__repr__`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.jobs.render import Block, to_html, to_text

FINISHED_STATES = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class Lease:
    """The GPUs a running job holds: `devices` of one `host`, all of `gpu_type`."""

    host: str
    gpu_type: str
    devices: tuple[str, ...]

    @classmethod
    def from_json(cls, value: Any) -> Lease | None:
        if not isinstance(value, Mapping):
            return None
        devices = tuple(str(d) for d in value.get("devices") or ())
        return cls(str(value.get("host", "")), str(value.get("gpu_type", "")), devices)

    def __str__(self) -> str:
        return f"{self.host} [{', '.join(self.devices)}]"


@dataclass(frozen=True)
class Job:
    """One background job as the gateway reports it (the contract's job record)."""

    id: str
    name: str
    state: str
    gpus: int
    steps: int
    steps_done: int = 0
    weight: float = 1.0
    owner_kernel: str | None = None
    throughput: Mapping[str, float] = field(default_factory=dict)
    lease: Lease | None = None
    submitted_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    preemptions: int = 0
    lost_steps: int = 0
    restarts: int = 0
    exit_code: int | None = None
    error: str | None = None
    log_tail: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Job:
        throughput = record.get("throughput") or {}
        return cls(
            id=str(record.get("id", "")),
            name=str(record.get("name", "")),
            state=str(record.get("state", "")),
            gpus=int(record.get("gpus") or 0),
            steps=int(record.get("steps") or 0),
            steps_done=int(record.get("steps_done") or 0),
            weight=float(record.get("weight") or 1.0),
            owner_kernel=record.get("owner_kernel"),
            throughput={str(k): float(v) for k, v in throughput.items()},
            lease=Lease.from_json(record.get("lease")),
            submitted_at=record.get("submitted_at"),
            started_at=record.get("started_at"),
            finished_at=record.get("finished_at"),
            preemptions=int(record.get("preemptions") or 0),
            lost_steps=int(record.get("lost_steps") or 0),
            restarts=int(record.get("restarts") or 0),
            exit_code=record.get("exit_code"),
            error=record.get("error"),
            log_tail=tuple(str(line) for line in record.get("log_tail") or ()),
        )

    @property
    def progress(self) -> float:
        """The share of the step budget done, 0 to 1."""
        return min(1.0, self.steps_done / self.steps) if self.steps > 0 else 0.0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def throughput_text(self) -> str:
        """The learned rate on the GPU type the job runs on (else its best one), or ``-``."""
        if not self.throughput:
            return "-"
        gpu_type = self.lease.gpu_type if self.lease else ""
        if gpu_type not in self.throughput:
            gpu_type = max(self.throughput, key=lambda t: self.throughput[t])
        return f"{self.throughput[gpu_type]:.3g} steps/s ({gpu_type})"

    def row(self) -> tuple[str, ...]:
        """This job's row of the status table (`STATUS_HEADER`)."""
        return (
            self.id,
            self.name,
            self.state,
            str(self.gpus),
            f"{self.progress * 100:.0f}%",
            f"{self.steps_done}/{self.steps}",
            self.throughput_text(),
            str(self.lease) if self.lease else "-",
            str(self.preemptions),
        )

    def blocks(self) -> list[Block]:
        details = [
            ("state", self.state),
            ("GPUs", f"{self.gpus} (lease: {self.lease or 'none'})"),
            ("progress", f"{self.progress * 100:.0f}% ({self.steps_done} of {self.steps} steps)"),
            ("throughput", self.throughput_text()),
            ("weight", f"{self.weight:g}"),
            ("preemptions", f"{self.preemptions} ({self.lost_steps} steps lost)"),
            ("restarts", str(self.restarts)),
            ("owner kernel", self.owner_kernel or "-"),
            ("submitted", self.submitted_at or "-"),
        ]
        if self.started_at:
            details.append(("started", self.started_at))
        if self.finished_at:
            details.append(("finished", f"{self.finished_at} (exit code {self.exit_code})"))
        blocks = [Block(f"job {self.id} · {self.name}", rows=tuple(details))]
        if self.error:
            blocks.append(Block("error", self.error.splitlines()[0]))
        if self.log_tail and self.state == "failed":
            blocks.append(Block("log tail", lines=self.log_tail))
        return blocks

    def _repr_html_(self) -> str:
        return to_html(self.blocks())

    def __repr__(self) -> str:
        return to_text(self.blocks())


STATUS_HEADER = (
    "id",
    "name",
    "state",
    "GPUs",
    "progress",
    "steps",
    "throughput",
    "lease",
    "preemptions",
)


@dataclass(frozen=True)
class JobsStatus:
    """Every job the gateway knows, oldest first, and its job policy."""

    policy: str
    jobs: tuple[Job, ...]

    @classmethod
    def from_json(cls, answer: Mapping[str, Any]) -> JobsStatus:
        jobs = tuple(Job.from_json(record) for record in answer.get("jobs") or ())
        return cls(str(answer.get("policy", "")), jobs)

    def count(self, *states: str) -> int:
        return sum(1 for job in self.jobs if job.state in states)

    def blocks(self) -> list[Block]:
        lent = sum(len(j.lease.devices) for j in self.jobs if j.lease and not j.finished)
        running = self.count("running", "stopping")
        note = (
            f"policy {self.policy} · {self.count('queued')} queued, {running} running, "
            f"{lent} GPU{'' if lent == 1 else 's'} lent"
        )
        title = f"{len(self.jobs)} job{'' if len(self.jobs) == 1 else 's'}"
        rows = tuple(job.row() for job in self.jobs)
        blocks = [Block(title, note, STATUS_HEADER, rows, progress_column=4)]
        for job in self.jobs:
            if job.state == "failed":
                why = (job.error or f"exit code {job.exit_code}").splitlines()[0]
                blocks.append(Block(f"{job.id} failed: {why}", lines=job.log_tail))
        return blocks

    def _repr_html_(self) -> str:
        return to_html(self.blocks())

    def __repr__(self) -> str:
        return to_text(self.blocks())


@dataclass(frozen=True)
class JobLogs:
    """The last lines a job's process wrote (stdout and stderr)."""

    id: str
    lines: tuple[str, ...]

    @classmethod
    def from_json(cls, answer: Mapping[str, Any]) -> JobLogs:
        return cls(str(answer.get("id", "")), tuple(str(x) for x in answer.get("lines") or ()))

    def blocks(self) -> list[Block]:
        if not self.lines:
            return [Block(f"{self.id}: no output yet")]
        return [Block(f"{self.id}: last {len(self.lines)} lines", lines=self.lines)]

    def _repr_html_(self) -> str:
        return to_html(self.blocks())

    def __repr__(self) -> str:
        return "\n".join(self.lines) if self.lines else f"{self.id}: no output yet"


@dataclass(frozen=True)
class JobPolicy:
    """The policy that shares the lent GPUs among jobs, and the ones the gateway offers."""

    policy: str
    available: tuple[str, ...]

    @classmethod
    def from_json(cls, answer: Mapping[str, Any]) -> JobPolicy:
        available = tuple(str(name) for name in answer.get("available") or ())
        return cls(str(answer.get("policy", "")), available)

    def _repr_html_(self) -> str:
        return to_html([Block(f"job policy: {self.policy}", "available: " + self._available())])

    def __repr__(self) -> str:
        return f"job policy: {self.policy}\navailable: {self._available()}"

    def _available(self) -> str:
        return ", ".join(self.available) or "-"


@dataclass(frozen=True)
class PolicyOutcome:
    """What the job simulator predicts for the current queue under one policy."""

    policy: str
    avg_jct_s: float
    makespan_s: float
    utilisation: float
    ftf_rho: Mapping[str, float]
    jobs: int

    @classmethod
    def from_json(cls, policy: str, value: Mapping[str, Any]) -> PolicyOutcome:
        rho = value.get("ftf_rho") or {}
        return cls(
            policy,
            float(value.get("avg_jct_s") or 0.0),
            float(value.get("makespan_s") or 0.0),
            float(value.get("utilisation") or 0.0),
            {str(k): float(v) for k, v in rho.items() if isinstance(v, int | float)},
            int(value.get("jobs") or 0),
        )

    def row(self) -> tuple[str, ...]:
        return (
            self.policy,
            str(self.jobs),
            hours(self.avg_jct_s),
            hours(self.makespan_s),
            f"{self.utilisation * 100:.0f}%",
            _rho(self.ftf_rho.get("median")),
            _rho(self.ftf_rho.get("max")),
        )


SIMULATION_HEADER = (
    "policy",
    "jobs",
    "avg JCT",
    "makespan",
    "utilisation",
    "rho median",
    "rho max",
)


@dataclass(frozen=True)
class Simulation:
    """A what-if of the current queue: each policy's predicted outcome."""

    outcomes: tuple[PolicyOutcome, ...]

    @classmethod
    def from_json(cls, answer: Mapping[str, Any]) -> Simulation:
        policies = answer.get("policies") or {}
        return cls(tuple(PolicyOutcome.from_json(name, v) for name, v in policies.items()))

    def __getitem__(self, policy: str) -> PolicyOutcome:
        for outcome in self.outcomes:
            if outcome.policy == policy:
                return outcome
        raise KeyError(policy)

    def blocks(self) -> list[Block]:
        if all(outcome.jobs == 0 for outcome in self.outcomes):
            return [Block("what-if of the queue", "no job is queued or running: nothing to replay")]
        note = "the current queue replayed by the job simulator on the GPUs lent to jobs"
        rows = tuple(outcome.row() for outcome in self.outcomes)
        return [Block("what-if of the queue", note, SIMULATION_HEADER, rows)]

    def _repr_html_(self) -> str:
        return to_html(self.blocks())

    def __repr__(self) -> str:
        return to_text(self.blocks())


def hours(value: float) -> str:
    """A simulated duration: seconds under 2 minutes, minutes under 2 hours, else hours."""
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.2f} h"


def _rho(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
