"""`JobsClient`: background jobs over the gateway's admin API (``/api/fleet/jobs``).

Built on `kernelfleet.client.FleetClient`, so it needs nothing beyond the standard library and
``cloudpickle`` (only to submit a function), and its errors are the fleet client's:
`FleetApiError` carries the gateway's status, reason and message (404 ``not-found`` for an
unknown id, 403 ``forbidden`` for cancelling another kernel's job, 409 ``never-fits`` for more
GPUs than any host has, 400 ``invalid-request`` for bad fields or an unknown policy), and
`GatewayUnreachable` says the gateway did not answer. Ids may be shortened as long as one job
matches (``1a2b`` for ``job-1a2b3c4d``); `AmbiguousJobId` when more than one does.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from kernelfleet.client import DEFAULT_TIMEOUT, ClientError, FleetClient
from kernelfleet.jobs.records import Job, JobLogs, JobPolicy, JobsStatus, Simulation

JOBS_PATH = "/api/fleet/jobs"


class AmbiguousJobId(ClientError):
    """A shortened job id that more than one job's id starts with; the message lists them."""

    reason = "ambiguous-id"


class JobsClient:
    """Submit, watch and cancel background jobs through `fleet` (a `FleetClient`, whose token
    decides what may be done: a kernel token cancels only its own kernel's jobs)."""

    def __init__(self, fleet: FleetClient) -> None:
        self.fleet = fleet

    def __repr__(self) -> str:
        return f"JobsClient({self.fleet!r})"

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> JobsClient:
        """The client of the kernel this code runs in (`FleetClient.from_environment`)."""
        return cls(FleetClient.from_environment(environ, timeout=timeout))

    def submit(
        self,
        target: str | os.PathLike[str] | Callable[[], Any],
        *,
        gpus: int,
        steps: int,
        name: str | None = None,
        weight: float | None = None,
        args: Sequence[str] = (),
    ) -> Job:
        """Queue a job of `gpus` GPUs and a budget of `steps` steps; returns its record.

        `target` is a script's path (its text is sent: the gateway keeps it, so the file may
        change afterwards) run with `args` as its argv, or a callable of no arguments, pickled
        with cloudpickle and run in the job process (`args` must then be empty). `name`
        defaults to the script's stem or the function's name; `weight` (a priority, default 1
        at the gateway) is sent only when given. The gateway checks the numbers."""
        body = submission(target, gpus=gpus, steps=steps, name=name, weight=weight, args=args)
        return Job.from_json(self.fleet.request("POST", JOBS_PATH, body))

    def status(self) -> JobsStatus:
        """Every job the gateway knows, oldest first, and the job policy."""
        return JobsStatus.from_json(self.fleet.request("GET", JOBS_PATH))

    def job(self, job_id: str) -> Job:
        """One job's record."""
        return Job.from_json(self.fleet.request("GET", self._path(job_id)))

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (a running one is stopped as a preemption is: SIGTERM, the grace
        period, SIGKILL); returns its record, state ``cancelled``."""
        return Job.from_json(self.fleet.request("DELETE", self._path(job_id)))

    def logs(self, job_id: str, tail: int | None = None) -> JobLogs:
        """The last `tail` lines (all the gateway keeps: None) the job's process wrote."""
        query = "" if tail is None else "?" + urlencode({"tail": tail})
        return JobLogs.from_json(self.fleet.request("GET", self._path(job_id, "/logs") + query))

    def policy(self, name: str | None = None) -> JobPolicy:
        """The job policy and those available; with `name`, make that the policy first."""
        path = f"{JOBS_PATH}/policy"
        if name is None:
            return JobPolicy.from_json(self.fleet.request("GET", path))
        return JobPolicy.from_json(self.fleet.request("PUT", path, {"policy": name}))

    def simulate(self, policies: Sequence[str] | None = None) -> Simulation:
        """A what-if of the current queue under each of `policies` (the gateway's choice when
        None), from the job simulator on the fleet's lent GPUs."""
        body = {} if not policies else {"policies": list(policies)}
        return Simulation.from_json(self.fleet.request("POST", f"{JOBS_PATH}/simulate", body))

    def resolve(self, job_id: str) -> str:
        """The full id of the one job whose id is `job_id` or starts with it (with or without
        ``job-``); `job_id` itself when none does (the gateway then says it is unknown).
        Raises `AmbiguousJobId` when several do."""
        return match_job_id(job_id, [job.id for job in self.status().jobs])

    def _path(self, job_id: str, suffix: str = "") -> str:
        return f"{JOBS_PATH}/{quote(self.resolve(job_id), safe='')}{suffix}"


def submission(
    target: str | os.PathLike[str] | Callable[[], Any],
    *,
    gpus: int,
    steps: int,
    name: str | None = None,
    weight: float | None = None,
    args: Sequence[str] = (),
) -> dict[str, Any]:
    """The body of ``POST /api/fleet/jobs`` for `JobsClient.submit`'s arguments: the script's
    text as ``source`` (read now) or the function pickled as ``function``. Raises `ValueError`
    for `args` with a function, `OSError` for a script that cannot be read."""
    body: dict[str, Any] = {"gpus": gpus, "steps": steps}
    if callable(target):
        if args:
            raise ValueError("args are a script's argv: a function takes none")
        body["function"] = pickle_function(target)
        body["name"] = name or getattr(target, "__name__", "function")
    else:
        path = Path(target)
        body["source"] = path.read_text()
        body["name"] = name or path.stem
        if args:
            body["args"] = [str(arg) for arg in args]
    if weight is not None:
        body["weight"] = weight
    return body


def match_job_id(job_id: str, ids: Sequence[str]) -> str:
    """The one of `ids` that is `job_id` or starts with it (with or without ``job-``);
    `job_id` itself when none does. Raises `AmbiguousJobId` when several do."""
    if job_id in ids:
        return job_id
    matches = [i for i in ids if i.startswith(job_id) or i.startswith(f"job-{job_id}")]
    if len(matches) > 1:
        raise AmbiguousJobId(
            f"{job_id!r} is the start of {len(matches)} job ids ({', '.join(matches)}): "
            "give more of it"
        )
    return matches[0] if matches else job_id


def pickle_function(function: Callable[[], Any]) -> str:
    """`function` as the API's ``"function"`` field: base64 of its cloudpickle, which carries
    a notebook's function by value (its code and what it closes over)."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps(function)).decode("ascii")
