"""The background jobs one host agent runs: launch, watch, stop, and find again after a restart.

A job is a Python script (or a pickled function, run by ``python -m kernelfleet.jobs.sdk``)
that the gateway's job scheduler places on some of this host's GPUs. The agent:

- writes the job's program into ``<state_dir>/jobs/<id>/`` and starts it in a session of its
  own with ``CUDA_VISIBLE_DEVICES`` = exactly the leased devices, the environment the gateway
  chose (`kernelfleet.protocol.JobEnv`) and, when kernels run as users of their own, as a user
  of the job's own (a uid derived from the job id, `kernelfleet.privileges.kernel_uid`);
- sends its stdout and stderr to ``job.log`` (the agent's file, 0600) and reports its exit code
  in the host report (``jobs``), at once when it exits;
- stops it on request: SIGTERM to its process group, ``grace`` seconds, then SIGKILL; the
  answer says whether it had to be killed;
- keeps ``job.json`` (its pid and the pid's start time) beside it, so an agent started again
  adopts the jobs still running (it cannot learn the exit code of a process it did not start:
  such a job reports ``exit_code`` null once it is gone) and reports those that ended.

Nothing here imports ``tornado.web``: failures are ``kernelfleet.errors`` domain errors.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.errors import Conflict, InvalidRequest, NotFound
from kernelfleet.kernels.agent.kernel_process import (
    KERNEL_UMASK,
    Isolation,
    ReplicaFolders,
    account_of,
)
from kernelfleet.protocol import JobEnv

log = logging.getLogger("kernelfleet.host.jobs")

JOB_ID = re.compile(r"job-[A-Za-z0-9_-]{1,64}")
JOB_LOG = "job.log"
JOB_STATE = "job.json"
LOG_TAIL_LINES = 20
SCRUBBED_ENV = frozenset({"KERNELFLEET_TOKEN"})
"""Never handed to jobs: their code must not be able to drive the host agent."""


@dataclass(frozen=True)
class JobRequest:
    """``POST /api/jobs``: what to run, on which of this host's devices, with what env."""

    job_id: str
    devices: tuple[str, ...]
    env: Mapping[str, str]
    source: str | None = None
    function: bytes | None = None
    args: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> JobRequest:
        job_id = body.get("job_id")
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise InvalidRequest(f"'job_id' must match {JOB_ID.pattern}, not {job_id!r}")
        devices = body.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise InvalidRequest("'devices' must be a list of device ids")
        env = body.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise InvalidRequest("'env' must map names to strings")
        args = body.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise InvalidRequest("'args' must be a list of strings")
        source, function = body.get("source"), body.get("function")
        if (source is None) == (function is None):
            raise InvalidRequest("give exactly one of 'source' and 'function'")
        if source is not None and not isinstance(source, str):
            raise InvalidRequest("'source' must be the script's text")
        pickled = None
        if function is not None:
            try:
                pickled = base64.b64decode(str(function), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("'function' must be base64") from None
        return cls(job_id, tuple(devices), dict(env), source, pickled, tuple(args))


@dataclass
class JobProcess:
    """One job process of this agent: running, or exited (kept until the gateway forgets it)."""

    id: str
    folder: Path
    devices: tuple[str, ...]
    pid: int
    started: float
    """The pid's start time (`_start_time`): a later process with the same pid is not it."""
    process: asyncio.subprocess.Process | None = None
    """The child, when this agent started it (None for an adopted job)."""
    exit_code: int | None = None
    exited: bool = False
    killed: bool = False
    """It did not exit within the grace period of a stop and was sent SIGKILL."""
    stop_requested: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def log_path(self) -> Path:
        return self.folder / JOB_LOG

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last `lines` lines of its stdout and stderr."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:] if lines > 0 else []

    def model(self) -> dict[str, Any]:
        """The job as the agent reports it (``GET /api/jobs``, the host report's ``jobs``)."""
        return {
            "id": self.id,
            "pid": self.pid,
            "devices": list(self.devices),
            "state": "exited" if self.exited else "running",
            "exit_code": self.exit_code,
            "killed": self.killed,
            "stop_requested": self.stop_requested,
        }


class JobTable:
    """The jobs of this agent; see the module docstring. ``on_change`` is called (on the event
    loop) whenever a job starts or exits, so the agent can heartbeat at once."""

    FOLDER = "jobs"
    """The subfolder of the state folder that holds one folder per process."""
    NOUN = "job"
    """What its processes are called in messages and logs."""

    def __init__(
        self,
        state_dir: Path,
        isolation: Isolation,
        gateway_url: str = "",
        on_change: Callable[[], None] = lambda: None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.jobs_dir = state_dir / self.FOLDER
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.jobs_dir.chmod(0o711)
        self.isolation = isolation
        self.gateway_url = gateway_url
        self._on_change = on_change
        self._base_env = dict(os.environ if base_env is None else base_env)
        self.cache_broker: Path | None = None
        """The socket of the agent's cache broker, told to its processes; None: no broker."""
        self._jobs: dict[str, JobProcess] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def get(self, job_id: str) -> JobProcess:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise NotFound(f"this host runs no {self.NOUN} {job_id!r}") from None

    def models(self) -> list[dict[str, Any]]:
        return [job.model() for job in self._jobs.values()]

    async def start(self, request: JobRequest) -> JobProcess:
        """Launch the job; `Conflict` if this host runs it already (exited ones are replaced)."""
        old = self._jobs.get(request.job_id)
        if old is not None and not old.exited:
            raise Conflict(
                f"{self.NOUN} {request.job_id} already runs on this host (pid {old.pid})"
            )
        self._jobs.pop(request.job_id, None)  # an exited run: a late forget must not hit this one
        owner = self._owner(request)
        account = account_of(owner[0]) if owner is not None else None
        if owner is not None and account is not None:
            raise Conflict(
                f"{self.NOUN} {request.job_id} would run as uid {owner[0]}, which is the system "
                f"account {account!r}'s: submit it again (a new id)"
            )
        folder = self.jobs_dir / request.job_id
        folders = ReplicaFolders(folder, owner)
        folder_env = folders.prepare()
        command = self._command(request, folders)
        env = self._job_env(request, folder_env)
        options: dict[str, Any] = {}
        if owner is not None:
            options = {"user": owner[0], "group": owner[1], "extra_groups": [],
                       "umask": KERNEL_UMASK}  # fmt: skip
        log_fd = os.open(folder / JOB_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                env=env,
                cwd=str(folders.work if owner is not None else folder),
                start_new_session=True,
                **options,
            )
        finally:
            os.close(log_fd)
        job = JobProcess(request.job_id, folder, request.devices, process.pid,
                         _start_time(process.pid) or 0.0, process)  # fmt: skip
        self._jobs[job.id] = job
        self._save(job)
        log.info("%s %s started: pid %d on device(s) %s", self.NOUN, job.id, job.pid,
                 ",".join(job.devices) or "none")  # fmt: skip
        self._watch(self._reap(job))
        self._on_change()
        return job

    async def stop(self, job_id: str, grace: float) -> JobProcess:
        """SIGTERM the job's process group, wait up to `grace` seconds, then SIGKILL it; returns
        once it exited. A job that exited already is answered as it is."""
        job = self.get(job_id)
        if job.exited:
            return job
        job.stop_requested = True
        self._signal(job, signal.SIGTERM)
        try:
            await asyncio.wait_for(job.done.wait(), grace)
        except TimeoutError:
            log.warning("%s %s ignored SIGTERM for %.1f s: killing it", self.NOUN, job.id, grace)
            job.killed = True
            self._signal(job, signal.SIGKILL)
            await job.done.wait()
        return job

    def forget(self, job_id: str) -> None:
        """Drop an exited job and its folder (its log with it); `Conflict` while it runs."""
        job = self.get(job_id)
        if not job.exited:
            raise Conflict(f"{self.NOUN} {job_id} still runs; stop it first")
        del self._jobs[job_id]
        shutil.rmtree(job.folder, ignore_errors=True)

    def adopt(self) -> list[str]:
        """At agent start: take back the jobs a previous agent left (`JOB_STATE` files). Those
        whose process still runs are watched again; the others are reported exited with an
        unknown exit code. Returns their ids."""
        found = []
        for state_file in sorted(self.jobs_dir.glob(f"*/{JOB_STATE}")):
            try:
                saved = json.loads(state_file.read_text())
                job = JobProcess(saved["id"], state_file.parent, tuple(saved["devices"]),
                                 int(saved["pid"]), float(saved["started"]))  # fmt: skip
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("cannot adopt the job in %s: %s", state_file.parent, e)
                continue
            self._jobs[job.id] = job
            if _start_time(job.pid) == job.started:
                log.info("job %s adopted: pid %d still runs", job.id, job.pid)
                self._watch(self._watch_adopted(job))
            else:
                self._exited(job, None)
            found.append(job.id)
        return found

    async def stop_all(self, grace: float) -> None:
        """At agent exit: stop every running job (its checkpoint is its own business)."""
        running = [job.id for job in self._jobs.values() if not job.exited]
        await asyncio.gather(*(self.stop(job_id, grace) for job_id in running))

    # -- what differs between kinds of processes (`kernels.agent.tool_workers`) -------------

    def _owner(self, request: JobRequest) -> tuple[int, int] | None:
        """The (uid, gid) it runs as (None: the agent's own): a user of the job's own."""
        return self.isolation.owner(request.job_id)

    def _command(self, request: JobRequest, folders: ReplicaFolders) -> list[str]:
        """Its command line, once what it runs is written into its folder."""
        program = self._write_program(request, folders)
        if request.function is not None:
            return [sys.executable, "-u", "-m", "kernelfleet.jobs.sdk", str(program)]
        return [sys.executable, "-u", str(program), *request.args]

    # -- internals --------------------------------------------------------------------------

    def _write_program(self, request: JobRequest, folders: ReplicaFolders) -> Path:
        """The script (or the pickled function) where the job's user may read it."""
        name, data = (
            ("function.pkl", request.function)
            if request.function is not None
            else ("job.py", (request.source or "").encode())
        )
        path = folders.directory / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(data or b"")
        if folders.owner is not None:
            os.chown(path, *folders.owner, follow_symlinks=False)
        return path

    def _job_env(self, request: JobRequest, folder_env: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self._base_env.items() if k not in SCRUBBED_ENV}
        env.pop(JobEnv.GATEWAY_URL.value, None)
        env.update(request.env)
        env.update(folder_env)
        if self.gateway_url:
            env[JobEnv.GATEWAY_URL.value] = self.gateway_url
        env[JobEnv.JOB_ID.value] = request.job_id
        env["CUDA_VISIBLE_DEVICES"] = ",".join(request.devices)
        env["KERNELFLEET_GPUS"] = ",".join(request.devices)
        if self.cache_broker is not None:
            env[JobEnv.CACHE_BROKER.value] = str(self.cache_broker)
        return env

    def _watch(self, watching: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(watching)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _reap(self, job: JobProcess) -> None:
        assert job.process is not None
        code = await job.process.wait()
        self._exited(job, code)

    async def _watch_adopted(self, job: JobProcess, interval: float = 0.5) -> None:
        while _start_time(job.pid) == job.started:  # noqa: ASYNC110 (not our child: polled)
            await asyncio.sleep(interval)
        self._exited(job, None)

    def _exited(self, job: JobProcess, code: int | None) -> None:
        job.exited, job.exit_code = True, code
        job.done.set()
        with contextlib.suppress(OSError):
            (job.folder / JOB_STATE).unlink()
        log.info("%s %s exited with code %s%s", self.NOUN, job.id, code,
                 " (killed after its grace period)" if job.killed else "")  # fmt: skip
        self._on_change()

    def _save(self, job: JobProcess) -> None:
        state = {"id": job.id, "devices": list(job.devices), "pid": job.pid,
                 "started": job.started}  # fmt: skip
        temporary = job.folder / f".{JOB_STATE}.tmp"
        temporary.write_text(json.dumps(state))
        os.replace(temporary, job.folder / JOB_STATE)

    @staticmethod
    def _signal(job: JobProcess, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, signum)


def _start_time(pid: int) -> float | None:
    """When process `pid` started (field 22 of ``/proc/<pid>/stat``, in clock ticks), or None
    if it does not run; a pid reused by another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if fields and fields[0] == "Z":
        return None  # a zombie has exited
    try:
        return float(fields[19])
    except (IndexError, ValueError):
        return time.time()
