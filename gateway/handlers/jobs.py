"""``/api/fleet/jobs``: background jobs (docs/jobs.md). The fleet token may do everything; a
kernel's token may read every job, submit jobs (its kernel owns them), cancel its own kernel's
jobs only (403 otherwise) and read or set the job policy. A job's own token (``kfj1.``) may only
report that job's progress.
"""

from __future__ import annotations

from tornado import web

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.gateway.jobs.service import JobService
from kernelfleet.protocol import JOB_TOKEN_PREFIX
from kernelfleet.web import KernelAccess, token_from_request

_ANY = KernelAccess.ANY


class JobsBase(GatewayHandler):
    @property
    def jobs(self) -> JobService:
        service: JobService = self.settings["job_service"]
        return service


class JobsHandler(JobsBase):
    kernel_access = {"GET": _ANY, "POST": _ANY}

    def get(self) -> None:
        self.write_json({"policy": self.jobs.policy, "jobs": [j.model() for j in self.jobs.all()]})

    def post(self) -> None:
        job = self.jobs.submit(self.json_body(), self.kernel_principal)
        self.set_header("Location", f"/api/fleet/jobs/{job.id}")
        self.write_json(job.model(), status=201)


class JobHandler(JobsBase):
    kernel_access = {"GET": _ANY, "DELETE": _ANY}

    def get(self, job_id: str) -> None:
        self.write_json(self.jobs.get(job_id).model())

    async def delete(self, job_id: str) -> None:
        owner, caller = self.jobs.get(job_id).owner_kernel, self.kernel_principal
        if caller is not None and owner != caller:
            submitter = f"kernel {owner}" if owner else "the fleet token"
            raise web.HTTPError(
                403,
                f"job {job_id} was submitted by {submitter}; kernel {caller}'s token "
                "cancels only its own kernel's jobs",
            )
        self.write_json((await self.jobs.cancel(job_id)).model())


class JobLogsHandler(JobsBase):
    kernel_access = {"GET": _ANY}

    async def get(self, job_id: str) -> None:
        raw = self.get_argument("tail", "100")
        try:
            tail = int(raw)
        except ValueError:
            raise InvalidRequest(f"'tail' must be a number of lines, not {raw!r}") from None
        if tail < 0:
            raise InvalidRequest("'tail' must be >= 0")
        self.write_json({"id": job_id, "lines": await self.jobs.logs(job_id, tail)})


class JobProgressHandler(JobsBase):
    """``POST /api/fleet/jobs/{id}/progress``: the job's own report (`kernelfleet.jobs.sdk`)."""

    def check_token(self) -> None:
        presented = token_from_request(self.request)
        if presented is not None and presented.startswith(f"{JOB_TOKEN_PREFIX}."):
            if not self.jobs.check_job_token(self.path_kwargs.get("job_id", ""), presented):
                raise web.HTTPError(403, "a job's token reports that job's progress only")
            return
        super().check_token()  # the fleet token; anything else is 401 or 403

    def post(self, job_id: str) -> None:
        self.write_json(self.jobs.progress(job_id, self.json_body()).model())


class JobPolicyHandler(JobsBase):
    kernel_access = {"GET": _ANY, "PUT": _ANY}

    def get(self) -> None:
        self.write_json(self._model())

    def put(self) -> None:
        name = self.json_body().get("policy")
        if not isinstance(name, str):
            raise InvalidRequest('the body must be {"policy": NAME}')
        self.jobs.set_policy(name)
        self.write_json(self._model())

    def _model(self) -> dict[str, object]:
        return {"policy": self.jobs.policy, "available": self.jobs.available_policies()}


class JobSimulateHandler(JobsBase):
    kernel_access = {"POST": _ANY}

    async def post(self) -> None:
        policies = self.json_body().get("policies")
        if policies is not None and (
            not isinstance(policies, list) or not all(isinstance(p, str) for p in policies)
        ):
            raise InvalidRequest("'policies' must be a list of policy names")
        self.write_json({"policies": await self.jobs.simulate(policies)})


def job_routes() -> list[tuple[str, type]]:
    job = r"(?P<job_id>[\w-]+)"
    return [
        (r"/api/fleet/jobs/?", JobsHandler),
        (r"/api/fleet/jobs/policy/?", JobPolicyHandler),
        (r"/api/fleet/jobs/simulate/?", JobSimulateHandler),
        (rf"/api/fleet/jobs/{job}/?", JobHandler),
        (rf"/api/fleet/jobs/{job}/logs/?", JobLogsHandler),
        (rf"/api/fleet/jobs/{job}/progress/?", JobProgressHandler),
    ]
