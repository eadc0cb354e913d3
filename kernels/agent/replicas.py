"""The replica table: the kernel processes one host agent runs, and their life cycle.

A replica is one ipykernel process launched through ``jupyter_client.AsyncKernelManager`` from a
kernelspec the host knows. The table is the only owner of those processes: the HTTP handlers
call ``start`` / ``interrupt`` / ``restart`` / ``stop``, the agent calls ``watch`` (a task that
notices processes that died on their own) and ``stop_all`` at exit, and reads ``models()`` for
every heartbeat. Every state change calls ``on_change`` so the agent can heartbeat at once.

A replica's folder (``<state_dir>/replicas/<id>``) is removed once its process is reaped, when
it is stopped (a dead replica stays, folder and all, until the gateway stops or restarts it);
a replica that failed to start keeps its ``kernel.log`` only. ``keep_logs_for`` seconds > 0
keep every stopped replica's ``kernel.log`` (for debugging) that long. `remove_stale_folders`,
at agent start, removes the folders of replicas no process runs any more; ``watch`` does it
again every `SWEEP_INTERVAL` seconds (replicas of a dead agent that outlived it a while).

Nothing here imports ``tornado.web``: failures are ``kernelfleet.errors`` domain errors.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import zmq
import zmq.asyncio
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager
from traitlets.config import Configurable

from kernelfleet.errors import Conflict, InvalidRequest, KernelDead, KernelStartFailed, NotFound
from kernelfleet.kernels.agent.containers.engine import EngineUnavailable
from kernelfleet.kernels.agent.containers.provisioner import ContainerProvisioner
from kernelfleet.kernels.agent.containers.runtime import ContainerRuntime, FoundContainer
from kernelfleet.kernels.agent.containers.spec import ContainerSpec, container_spec
from kernelfleet.kernels.agent.kernel_process import (
    PORT_TAKEN,
    Isolation,
    KernelUser,
    ReplicaFolders,
    ReplicaKernelManager,
    StartError,
    account_of,
    choose_isolation,
    process_exit_code,
    remove_replica_folder,
    sweep_replica_folders,
    wait_ready,
)
from kernelfleet.kernels.agent.ports import free_ports
from kernelfleet.limits import max_sockets
from kernelfleet.privileges import not_writable_by
from kernelfleet.protocol import CONNECTION_KEYS, ReplicaEnv
from kernelfleet.states import Transitions, check_transition

log = logging.getLogger("kernelfleet.host.replicas")

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LOG_TAIL_LINES = 30
ZMQ_PORTS = tuple(key for key in CONNECTION_KEYS if key.endswith("_port"))
PORT_ATTEMPTS = 3  # launches with fresh ports when another process took one first
# Never handed to kernels: user code must not be able to drive the host agent.
SCRUBBED_ENV = frozenset({"KERNELFLEET_TOKEN"})
INHERITED_BY_CONTAINERS = "KERNELFLEET_"
"""A container inherits only the agent's variables of this prefix (log level, Raft and garbage
collection settings): the rest (PATH, PYTHONPATH, a virtualenv) describe the host, not the image."""
SWEEP_INTERVAL = 300.0  # seconds between sweeps of stale replica folders
ENGINE_RECHECK = 2.0
"""Seconds between two pings of a container engine that stopped answering."""
SWEEP_MIN_AGE = 60.0  # a folder this recent may belong to a replica starting now


class ReplicaState(enum.Enum):
    """Where a replica is in its life. ``STOPPED`` replicas are forgotten at once."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    DEAD = "dead"
    STOPPED = "stopped"


_TRANSITIONS: Transitions[ReplicaState] = {
    ReplicaState.STARTING: frozenset({ReplicaState.READY, ReplicaState.DEAD, ReplicaState.STOPPED}),
    ReplicaState.READY: frozenset(
        {ReplicaState.RESTARTING, ReplicaState.DEAD, ReplicaState.STOPPED}
    ),
    ReplicaState.RESTARTING: frozenset(
        {ReplicaState.READY, ReplicaState.DEAD, ReplicaState.STOPPED}
    ),
    ReplicaState.DEAD: frozenset({ReplicaState.RESTARTING, ReplicaState.STOPPED}),
    ReplicaState.STOPPED: frozenset(),
}


@dataclass(frozen=True)
class ReplicaRequest:
    """What ``POST /api/replicas`` asks for, validated."""

    replica_id: str
    kernel_id: str
    kernel_name: str
    env: dict[str, str] = field(default_factory=dict)
    launch_timeout: float | None = None
    raft: bool = False
    """Reserve a Raft port for the replica (reported as ``raft_address``)."""
    kernel_token: str = field(default="", repr=False)
    """The kernel's own token from the gateway (`ReplicaEnv.KERNEL_TOKEN`); never reported."""

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ReplicaRequest:
        """Validate a decoded JSON body; raise ``InvalidRequest`` naming the first bad field."""
        replica_id = _required_str(body, "replica_id")
        if not ID_PATTERN.fullmatch(replica_id):
            raise InvalidRequest(
                f"'replica_id' must match {ID_PATTERN.pattern} (letters, digits, '.', '_', '-')"
            )
        env = body.get("env")
        if env is None:
            env = {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise InvalidRequest("'env' must be an object of string names to string values")
        return cls(
            replica_id=replica_id,
            kernel_id=_required_str(body, "kernel_id"),
            kernel_name=_required_str(body, "kernel_name"),
            env=dict(env),
            launch_timeout=parse_timeout(body.get("launch_timeout"), "launch_timeout"),
            raft=_optional_bool(body, "raft"),
            kernel_token=_optional_str(body, "kernel_token"),
        )


def _optional_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name!r} must be true or false")
    return value


def _optional_str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str) or len(value) > 512:
        raise InvalidRequest(f"{name!r} must be a string of at most 512 characters")
    return value


def _required_str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidRequest(f"{name!r} is required: a non-empty string of at most 256 characters")
    return value


def parse_timeout(value: Any, name: str) -> float | None:
    """A positive finite number of seconds, or None; ``InvalidRequest`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidRequest(f"{name!r} must be a number of seconds, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{name!r} must be a number of seconds or null")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{name!r} must be a positive number of seconds, not {value}")
    return float(value)


class Replica:
    """One kernel process and what the fleet knows about it.

    Mutated only by ``ReplicaTable``, under ``lock`` for start/restart/stop.
    """

    def __init__(
        self,
        request: ReplicaRequest,
        km: AsyncKernelManager,
        directory: Path,
        launch_timeout: float,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.request = request
        self.id = request.replica_id
        self.kernel_id = request.kernel_id
        self.kernel_name = request.kernel_name
        self.km = km
        self.directory = directory
        self.log_path = directory / "kernel.log"
        self.owner = owner
        """The (uid, gid) its process runs as; None: the agent's own user."""
        self.folder_env: dict[str, str] = {}
        self.state = ReplicaState.STARTING
        self.exit_code: int | None = None
        self.lock = asyncio.Lock()
        self.log_file: IO[bytes] | None = None
        self.launch_timeout = launch_timeout  # the default for restarts
        self.raft_address: str | None = None
        self.ports: list[int] = []
        """The ports this agent gave the replica: 5 ZMQ ports, then its Raft port if any."""

    def open_log(self) -> None:
        """Open kernel.log for appending (the kernel's stdout and stderr); kept open until stop.
        Only the agent may open it (0600): the kernel writes through the descriptor it inherits,
        and another kernel's replica reads none of it."""
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        self.log_file = open(fd, "ab")  # noqa: SIM115 (closed by ReplicaTable._discard)

    def note(self, text: str) -> None:
        """Write a line of the agent's own into kernel.log (opened by `open_log`)."""
        assert self.log_file is not None
        self.log_file.write(f"--- kernelfleet: {text}\n".encode())
        self.log_file.flush()

    def move_to(self, state: ReplicaState) -> None:
        self.state = check_transition(_TRANSITIONS, f"replica {self.id}", self.state, state)

    @property
    def pid(self) -> int | None:
        pid = getattr(self.km.provisioner, "pid", None)
        return pid if isinstance(pid, int) else None

    def connection(self) -> dict[str, Any]:
        info = self.km.get_connection_info()
        conn = {key: info.get(key) for key in CONNECTION_KEYS}
        if isinstance(conn["key"], bytes):
            conn["key"] = conn["key"].decode()
        return conn

    def model(self) -> dict[str, Any]:
        """The JSON replica model of the host agent API."""
        return {
            "id": self.id,
            "kernel_id": self.kernel_id,
            "kernel_name": self.kernel_name,
            "pid": self.pid,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "connection": self.connection(),
            "raft_address": self.raft_address,
            "uid": None if self.owner is None else self.owner[0],
            "runtime": "process" if self.container is None else "container",
            "exit_reason": None if self.container is None else self.container.exit_reason,
        }

    @property
    def container(self) -> ContainerProvisioner | None:
        """The provisioner of its container, when it runs in one."""
        provisioner = self.km.provisioner
        return provisioner if isinstance(provisioner, ContainerProvisioner) else None

    @property
    def log_name(self) -> str:
        """Where `log_tail` reads: kernel.log, or the container's log while it exists."""
        container = self.container
        if container is not None and container.container_id is not None:
            return f"container {container.container_name} (image {container.spec.image})"
        return str(self.log_path)

    def log_tail(self, offset: int = 0, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of kernel.log written after byte ``offset``; for a replica
        in a container that still exists, the last lines of the container's log."""
        container = self.container
        if container is not None and container.container_id is not None:
            text = container.log_tail(lines).splitlines()[-lines:]
            return "\n".join(text) if text else "(the container wrote nothing)"
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(offset, size - 64 * 1024))
                data = f.read()
        except OSError as e:
            return f"(kernel.log could not be read: {e})"
        text = data.decode("utf-8", "replace").splitlines()[-lines:]
        return "\n".join(text) if text else "(kernel.log is empty)"


class ReplicaTable:
    """The replicas of one host, by replica id.

    ``base_env`` is the environment every kernel inherits (the agent's own, by default) before
    the request's ``env`` and the `ReplicaEnv` variables are laid over it; `SCRUBBED_ENV` is
    never passed on. ``config_parent`` (the agent application) lets the agent's configuration
    reach ``KernelManager`` and the kernel provisioners; its ``gateway_url`` (``--gateway``)
    is what replicas get as `ReplicaEnv.GATEWAY_URL`, with the kernel's token from the start
    request as `ReplicaEnv.KERNEL_TOKEN`. ``isolation`` says which user replicas run as
    (`choose_isolation`; by default the agent's own). ``containers`` runs the replicas of
    container kernelspecs (``metadata.kernelfleet.runtime = "container"``; without it they are
    refused); `adopt_containers` takes over those a previous agent left running.
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        kernel_spec_manager: KernelSpecManager,
        root_dir: Path,
        kernel_ip: str = "127.0.0.1",
        raft_ip: str = "",
        launch_timeout: float = 40.0,
        stop_timeout: float = 3.0,
        poll_interval: float = 0.5,
        base_env: Mapping[str, str] | None = None,
        on_change: Callable[[], None] = lambda: None,
        config_parent: Configurable | None = None,
        isolation: Isolation | None = None,
        keep_logs_for: float = 0.0,
        containers: ContainerRuntime | None = None,
    ) -> None:
        self.replicas_dir = state_dir / "replicas"
        self.cache_broker: Path | None = None
        """The socket of the agent's cache broker, told to replicas; None: no broker."""
        self.containers = containers
        self.engine_problem: str | None = None
        """Why the container engine does not answer, while it does not."""
        self.keep_logs_for = keep_logs_for
        self.isolation = isolation or choose_isolation(KernelUser.SAME, self.replicas_dir)
        self.kernel_spec_manager = kernel_spec_manager
        self.root_dir = root_dir
        self.kernel_ip = kernel_ip
        self.raft_ip = raft_ip or kernel_ip
        self._ports_given: set[int] = set()  # ports handed to live replicas, bound or not yet
        self.launch_timeout = launch_timeout
        self.stop_timeout = stop_timeout
        self.poll_interval = poll_interval
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.on_change = on_change
        self.config_parent = config_parent
        self._replicas: dict[str, Replica] = {}
        self._closing = False
        self._zmq_context = zmq.asyncio.Context()
        """Every kernel manager's and readiness client's sockets, for the agent's life: a
        context of their own would be terminated as they close, and terminating one blocks the
        event loop while libzmq winds down a connection to a port someone else holds. Each
        manager keeps a control socket: more than ZMQ's default 1023 on a large host."""
        self._zmq_context.set(zmq.MAX_SOCKETS, max_sockets(self._zmq_context.get(zmq.SOCKET_LIMIT)))

    # -- reading ----------------------------------------------------------------------------

    def get(self, replica_id: str) -> Replica:
        try:
            return self._replicas[replica_id]
        except KeyError:
            raise NotFound(f"no replica with id {replica_id!r} on this host") from None

    def all(self) -> list[Replica]:
        return sorted(self._replicas.values(), key=lambda r: r.id)

    def models(self) -> list[dict[str, Any]]:
        return [r.model() for r in self.all()]

    # -- life cycle -------------------------------------------------------------------------

    async def start(self, request: ReplicaRequest) -> Replica:
        """Launch a replica and return it once it answered ``kernel_info``.

        Raises ``NotFound`` (unknown kernelspec; the message lists the known ones), ``Conflict``
        (the replica id is in use, the agent is shutting down, or the kernel's own user is
        taken: another kernel's replica here or a system account has it), ``InvalidRequest`` (a bad
        ``KERNEL_LAUNCH_TIMEOUT``) or ``KernelStartFailed`` (the process exited, or stayed silent
        past the launch timeout; the message holds the tail of its kernel.log). A replica that
        failed to start is forgotten; its kernel.log stays on disk (the rest of its folder
        goes; a later sweep removes the log, unless ``keep_logs_for`` keeps it).
        """
        self._check_not_closing()
        if request.replica_id in self._replicas:
            raise Conflict(f"a replica with id {request.replica_id!r} already exists on this host")
        self._check_kernelspec(request.kernel_name)
        spec = self._container_spec(request.kernel_name)
        timeout = self._launch_timeout_for(request)
        owner = self._owner_for(request.kernel_id)
        directory = self.replicas_dir / request.replica_id
        folders = ReplicaFolders(directory, owner)
        folder_env = folders.prepare()
        km = self._kernel_manager(request.kernel_name, directory, owner)
        replica = Replica(request, km, directory, timeout, owner)
        replica.folder_env = folder_env
        self._assign_ports(replica)
        self._replicas[replica.id] = replica
        self._changed()
        async with replica.lock:
            try:
                replica.open_log()
                cwd = str(self._kernel_cwd(replica, folders))
                launch_args: dict[str, Any] = {
                    "cwd": cwd,
                    "stdout": replica.log_file,
                    "stderr": replica.log_file,
                    **km.launch_options(),
                }
                if spec is not None:
                    self._use_container(replica, spec, [str(directory), cwd])
                for attempt in range(1, PORT_ATTEMPTS + 1):
                    launch_args["env"] = self._kernel_env(replica)
                    try:
                        await self._launch(replica, timeout, lambda: km.start_kernel(**launch_args))
                        break
                    except KernelStartFailed as e:
                        if PORT_TAKEN not in e.message or attempt == PORT_ATTEMPTS:
                            raise
                        log.warning("replica %s: a port was taken; new ports", replica.id)
                        km.cleanup_connection_file()
                        await km.cleanup_resources(restart=True)  # its control socket
                        self._assign_ports(replica)
                        self._set_state(replica, ReplicaState.RESTARTING)
                self._check_not_closing()
            except BaseException:
                if self._replicas.get(replica.id) is replica:
                    del self._replicas[replica.id]
                await self._discard(replica, keep_log=True)
                raise
            self._set_state(replica, ReplicaState.READY)
        if spec is not None:
            self._engine_back()
        return replica

    async def adopt_containers(self) -> list[str]:
        """Take over the replica containers a previous agent of this host id and state dir
        left running (found by their labels), as ready replicas with the ports and connection
        they had; remove those that exited. Return the ids adopted. Called at agent start,
        before the agent answers anything (the start's sweep of stale folders spared theirs:
        their processes, visible in ``/proc``, point to them). `EngineUnavailable` if the
        engine does not answer, which the host model then says from the first heartbeat."""
        if self.containers is None:
            return []
        adopted = []
        try:
            listed = await asyncio.to_thread(self.containers.found)
        except EngineUnavailable as e:
            self.engine_problem = e.message
            raise
        for found in listed:
            problem = self._why_not_adopt(found)
            if problem is None:
                try:
                    self._adopt(found)
                    adopted.append(found.replica_id)
                    continue
                except Exception as e:
                    problem = f"it could not be adopted: {e}"
            log.warning("container %s: %s; removing it", found.name, problem)
            await asyncio.to_thread(self.containers.remove, found.container_id)
        if adopted:
            self._changed()
        return adopted

    def _why_not_adopt(self, found: FoundContainer) -> str | None:
        if not found.running:
            return "it exited while no agent watched it"
        if not ID_PATTERN.fullmatch(found.replica_id) or found.replica_id in self._replicas:
            return f"its replica id {found.replica_id!r} is not valid here"
        if not (self.replicas_dir / found.replica_id / "connection.json").is_file():
            return "its replica folder has no connection file"
        if found.owner != self.isolation.owner(found.kernel_id):
            return "it runs as another user than this agent gives its kernel"
        return None

    def _adopt(self, found: FoundContainer) -> Replica:
        """A ready `Replica` for a running container `found` (see `adopt_containers`)."""
        assert self.containers is not None
        directory = self.replicas_dir / found.replica_id
        self._check_kernelspec(found.kernel_name)
        spec = self._container_spec(found.kernel_name)
        if spec is None:
            raise Conflict(f"kernelspec {found.kernel_name!r} no longer runs containers")
        km = self._kernel_manager(found.kernel_name, directory, found.owner)
        km.load_connection_file()
        request = ReplicaRequest(
            replica_id=found.replica_id,
            kernel_id=found.kernel_id,
            kernel_name=found.kernel_name,
            raft=bool(found.raft_address),
        )
        replica = Replica(request, km, directory, self.launch_timeout, found.owner)
        replica.raft_address = found.raft_address or None
        replica.ports = [int(getattr(km, name)) for name in ZMQ_PORTS]
        if found.raft_address:
            replica.ports.append(int(found.raft_address.rsplit(":", 1)[1]))
        self._ports_given.update(replica.ports)
        cwd = found.working_dir or str(directory)
        self._use_container(replica, spec, [str(directory), cwd])
        assert replica.container is not None
        replica.container.adopt(found.container_id)
        # What a restart launches with (start_kernel keeps it; this manager never started).
        km._launch_args = cast(Any, {"cwd": cwd, "env": found.env})
        replica.open_log()
        replica.note(f"adopted container {found.name} at {time.ctime()}")
        replica.state = ReplicaState.READY
        self._replicas[replica.id] = replica
        log.info("replica %s (kernel %s): adopted its running container %s", replica.id,
                 replica.kernel_id, found.name)  # fmt: skip
        return replica

    async def interrupt(self, replica_id: str) -> None:
        """Interrupt the replica's current cell (signal or message, as its kernelspec says)."""
        replica = self.get(replica_id)
        if replica.state is ReplicaState.DEAD:
            raise KernelDead(f"replica {replica_id} is dead (exit code {replica.exit_code})")
        if replica.state is not ReplicaState.READY:
            raise Conflict(f"replica {replica_id} is {replica.state.value}; try again when ready")
        await replica.km.interrupt_kernel()
        log.info("replica %s interrupted", replica_id)

    async def restart(self, replica_id: str, launch_timeout: float | None = None) -> Replica:
        """Restart the replica's process (same id, same ports, new pid, empty namespace).

        Works on a ready or a dead replica; returns once the new process answered ``kernel_info``.
        If the new process fails, the replica is left ``dead`` and ``KernelStartFailed`` raised.
        """
        replica = self.get(replica_id)
        async with replica.lock:
            if self._replicas.get(replica_id) is not replica:
                raise NotFound(f"no replica with id {replica_id!r} on this host")
            was_dead = replica.state is ReplicaState.DEAD
            self._set_state(replica, ReplicaState.RESTARTING)
            replica.exit_code = None
            timeout = launch_timeout or replica.launch_timeout
            try:
                await self._launch(
                    replica,
                    timeout,
                    lambda: replica.km.restart_kernel(now=was_dead, newports=False),
                )
                self._check_not_closing()
            except BaseException:
                if self._closing:
                    await self._discard(replica)
                raise
            self._set_state(replica, ReplicaState.READY)
        return replica

    async def stop(self, replica_id: str) -> None:
        """Shut the replica down (shutdown request, SIGTERM, then SIGKILL) and forget it.

        Waits for a start or restart of the same replica in progress to finish first.
        """
        replica = self.get(replica_id)
        async with replica.lock:
            if self._replicas.pop(replica_id, None) is not replica:
                raise NotFound(f"no replica with id {replica_id!r} on this host")
            await self._discard(replica)

    async def stop_all(self, grace: float) -> None:
        """Stop every replica within about ``grace`` seconds in all; kill what is left.

        Called once, when the agent exits. Starts and restarts still in progress notice it when
        their launch returns and kill their process; later ``start`` calls raise ``Conflict``.
        """
        self._closing = True
        replicas = list(self._replicas.values())
        self._replicas.clear()
        if not replicas:
            return
        log.info("stopping %d replica(s)", len(replicas))
        # Replicas in the middle of a start or restart are left to it: it sees _closing and
        # discards its process when its launch returns.
        idle = [r for r in replicas if not r.lock.locked()]
        for replica in idle:
            replica.km.shutdown_wait_time = max(0.2, min(self.stop_timeout, grace - 1.0))
        if idle:
            discards = [asyncio.ensure_future(self._discard(r)) for r in idle]
            _done, pending = await asyncio.wait(discards, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for replica in idle:
            await _kill_quietly(replica)  # whatever a cancelled shutdown left running

    async def watch(self) -> None:
        """Check ready replicas every ``poll_interval`` s, marking dead ones, sweep stale
        replica folders every `SWEEP_INTERVAL` s, and ping the container engine (if any) once,
        then every `ENGINE_RECHECK` s while it does not answer, until cancelled."""
        next_sweep = time.monotonic() + SWEEP_INTERVAL
        next_engine_check = 0.0
        engine_check: asyncio.Task[None] | None = None
        engine_checked = self.containers is None
        try:
            while True:
                await asyncio.sleep(self.poll_interval)
                if (
                    (self.engine_problem is not None or not engine_checked)
                    and (engine_check is None or engine_check.done())
                    and time.monotonic() >= next_engine_check
                ):
                    # a task of its own: an engine that hangs must not hold up the checks below
                    next_engine_check = time.monotonic() + ENGINE_RECHECK
                    engine_check = asyncio.ensure_future(self._check_engine())
                    engine_checked = True
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_INTERVAL
                    try:
                        await self._sweep_later()
                    except Exception:
                        log.exception("sweeping stale replica folders failed")
                for replica in list(self._replicas.values()):
                    if replica.state is not ReplicaState.READY or replica.lock.locked():
                        continue
                    try:
                        await self._check_alive(replica)
                    except Exception:
                        log.exception("replica %s: liveness check failed", replica.id)
        finally:
            if engine_check is not None:
                engine_check.cancel()

    async def _check_alive(self, replica: Replica) -> None:
        try:
            exit_code = await process_exit_code(replica.km)
        except EngineUnavailable as e:
            self._engine_lost(replica, e.message)
            return
        if replica.container is not None:
            self._engine_back()
        if exit_code is not None and replica.state is ReplicaState.READY:
            replica.exit_code = exit_code
            self._set_state(replica, ReplicaState.DEAD)
            log.warning(
                "replica %s (kernel %s) died with exit code %s; see %s",
                replica.id,
                replica.kernel_id,
                exit_code,
                replica.log_path,
            )

    def containers_model(self) -> dict[str, Any] | None:
        """The ``containers`` member of the host model: the engine and whether the agent
        reaches it (None: this agent runs no containers)."""
        if self.containers is None:
            return None
        problem = self.engine_problem
        return {"engine": self.containers.engine.url, "reachable": problem is None, "why": problem}

    def _engine_lost(self, replica: Replica, why: str) -> None:
        """The engine stopped answering about `replica`'s container: the agent can neither
        watch nor stop it, so the replica is given up for dead (the gateway moves its kernel);
        a stop still asks the kernel itself to exit, over its control channel."""
        if self.engine_problem is None:
            log.error("the container engine is gone: %s; its replicas are given up", why)
            self.engine_problem = why
        assert replica.container is not None
        replica.container.exit_reason = f"{why}: the agent can no longer watch its container"
        self._set_state(replica, ReplicaState.DEAD)

    async def _check_engine(self) -> None:
        """Ping the engine: once at start, so the host model says at once whether it answers,
        then while it does not, since the gateway places no container replica here meanwhile
        and no container start would find out that it is back."""
        assert self.containers is not None
        try:
            await asyncio.to_thread(self.containers.engine.ping)
        except EngineUnavailable as e:
            if self.engine_problem is None:
                log.error("%s: no container replica can start here", e.message)
                self.engine_problem = e.message
                self._changed()
            return
        self._engine_back()

    def _engine_back(self) -> None:
        if self.engine_problem is not None:
            log.warning("the container engine answers again")
            self.engine_problem = None
            self._changed()

    # -- internals --------------------------------------------------------------------------

    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:
            log.exception("the replica change callback failed")

    def _set_state(self, replica: Replica, state: ReplicaState) -> None:
        replica.move_to(state)
        self._changed()

    def _container_spec(self, name: str) -> ContainerSpec | None:
        """The kernelspec's container settings (None: a process); ``InvalidRequest`` for bad
        ones, ``Conflict`` if this agent runs no containers."""
        metadata = self.kernel_spec_manager.get_kernel_spec(name).metadata
        spec = container_spec(metadata, name)
        if spec is not None and self.containers is None:
            raise Conflict(
                f"kernelspec {name!r} runs kernels in containers (image {spec.image!r}), "
                "which this host agent does not: start it with --container-engine"
            )
        return spec

    def _use_container(self, replica: Replica, spec: ContainerSpec, binds: list[str]) -> None:
        """Have the replica's kernel manager start a container instead of a process."""
        assert self.containers is not None
        replica.km.provisioner = self.containers.provisioner(
            replica.km,
            spec,
            replica_id=replica.id,
            kernel_id=replica.kernel_id,
            raft_address=replica.raft_address,
            owner=replica.owner,
            binds=binds,
            log_sink=lambda data: _append_log(replica, data),
        )

    def _check_kernelspec(self, name: str) -> None:
        try:
            self.kernel_spec_manager.get_kernel_spec(name)
        except NoSuchKernel:
            known = ", ".join(sorted(self.kernel_spec_manager.find_kernel_specs())) or "(none)"
            raise NotFound(
                f"no kernelspec named {name!r} on this host; known kernelspecs: {known}"
            ) from None

    def _owner_for(self, kernel_id: str) -> tuple[int, int] | None:
        """The user the kernel's replicas run as; ``Conflict`` if that uid is taken (by another
        kernel's replica on this host, or by a system account)."""
        owner = self.isolation.owner(kernel_id)
        if owner is None:
            return None
        for other in self._replicas.values():
            if other.owner == owner and other.kernel_id != kernel_id:
                raise Conflict(
                    f"kernel {kernel_id} would run as uid {owner[0]}, which kernel "
                    f"{other.kernel_id} has on this host (a hash collision): start it again "
                    "under another id"
                )
        account = account_of(owner[0])
        if account is not None:
            raise Conflict(
                f"kernel {kernel_id} would run as uid {owner[0]}, which is the system account "
                f"{account!r}'s: start it again under another id"
            )
        return owner

    def _launch_timeout_for(self, request: ReplicaRequest) -> float:
        if request.launch_timeout is not None:
            return request.launch_timeout
        from_env = parse_timeout(request.env.get("KERNEL_LAUNCH_TIMEOUT"), "KERNEL_LAUNCH_TIMEOUT")
        return from_env if from_env is not None else self.launch_timeout

    def _kernel_env(self, replica: Replica) -> dict[str, str]:
        request = replica.request
        inherited = self.base_env
        if replica.container is not None:
            prefix = INHERITED_BY_CONTAINERS
            inherited = {k: v for k, v in inherited.items() if k.startswith(prefix)}
        env = {**inherited, **request.env}
        for name in (*SCRUBBED_ENV, ReplicaEnv.GATEWAY_URL.value, ReplicaEnv.KERNEL_TOKEN.value):
            env.pop(name, None)  # the agent's own values, or a request's: not the kernel's
        env.update(replica.folder_env)
        gateway_url = getattr(self.config_parent, "gateway_url", "")
        if gateway_url:
            env[ReplicaEnv.GATEWAY_URL.value] = gateway_url
        if request.kernel_token:
            env[ReplicaEnv.KERNEL_TOKEN.value] = request.kernel_token
        env[ReplicaEnv.KERNEL_ID.value] = request.kernel_id
        env[ReplicaEnv.REPLICA_ID.value] = request.replica_id
        env[ReplicaEnv.HOST_ADDRESS.value] = self.kernel_ip
        env[ReplicaEnv.REPLICA_DIR.value] = str(self.replicas_dir / request.replica_id)
        env[ReplicaEnv.GPUS.value] = ""  # none bound until a cell runs (not the agent's GPU count)
        if replica.raft_address:
            env[ReplicaEnv.RAFT_ADDRESS.value] = replica.raft_address
        if self.cache_broker is not None:
            env[ReplicaEnv.CACHE_BROKER.value] = str(self.cache_broker)
        return env

    def _kernel_cwd(self, replica: Replica, folders: ReplicaFolders) -> Path:
        """Where the kernel starts: the request's ``KERNEL_WORKING_DIR`` if it is a directory
        here, else the agent's ``root_dir``. A kernel that runs as a user of its own starts
        there only if that user may create files in it; otherwise in its private
        ``folders.work``, which kernel.log says once."""
        wanted = self._wanted_cwd(replica.request)
        if replica.owner is None:
            return wanted
        problem = not_writable_by(wanted, *replica.owner)
        if problem is None:
            return wanted
        replica.note(f"the kernel starts in {folders.work}, not in {wanted}: {problem}")
        log.info(
            "replica %s starts in %s, not in %s: %s", replica.id, folders.work, wanted, problem
        )
        return folders.work

    def _wanted_cwd(self, request: ReplicaRequest) -> Path:
        wanted = request.env.get("KERNEL_WORKING_DIR")
        if wanted:
            if Path(wanted).is_dir():
                return Path(wanted)
            log.info(
                "replica %s: KERNEL_WORKING_DIR %r is not a directory here; using %s",
                request.replica_id,
                wanted,
                self.root_dir,
            )
        return self.root_dir

    async def _launch(
        self, replica: Replica, ready_within: float, launch: Callable[[], Any]
    ) -> None:
        """Run ``launch`` (start or restart the process), then wait until the kernel is ready.

        On failure the process is killed, the replica is left ``dead`` (for the caller to forget
        or keep) and ``KernelStartFailed`` carries the kernel.log lines written by this attempt.
        """
        assert replica.log_file is not None
        replica.log_file.write(
            f"--- kernelfleet: launching replica {replica.id} at {time.ctime()}\n".encode()
        )
        replica.log_file.flush()
        offset = replica.log_file.tell()
        started = time.monotonic()
        try:
            await launch()
            await wait_ready(replica.km, ready_within, lambda: replica.log_tail(offset))
        except StartError as e:
            problem = str(e)
        except Exception as e:  # the launch itself failed: missing executable, bad argv, ...
            problem = f"could not be launched: {e}"
        else:
            log.info(
                "replica %s (kernel %s, %s) ready in %.2f s, %s",
                replica.id,
                replica.kernel_id,
                replica.kernel_name,
                time.monotonic() - started,
                f"pid {replica.pid}" if replica.container is None else replica.log_name,
            )
            return
        replica.exit_code = await _kill_quietly(replica)
        self._set_state(replica, ReplicaState.DEAD)
        container = replica.container
        if container is not None and container.exit_reason:
            problem = f"{problem} ({container.exit_reason})"
        tail = await asyncio.to_thread(replica.log_tail, offset)
        message = (
            f"kernel {replica.kernel_name!r} for replica {replica.id} {problem}; "
            f"last lines of {replica.log_name}:\n{tail}"
        )
        log.warning("%s", message)
        raise KernelStartFailed(message)

    def _kernel_manager(
        self, kernel_name: str, directory: Path, owner: tuple[int, int] | None
    ) -> ReplicaKernelManager:
        """The kernel manager of a replica in `directory`, run as `owner` (launch and adoption)."""
        km = ReplicaKernelManager(
            parent=self.config_parent,
            kernel_name=kernel_name,
            kernel_spec_manager=self.kernel_spec_manager,
            ip=self.kernel_ip,
            connection_file=str(directory / "connection.json"),
            shutdown_wait_time=self.stop_timeout,
            cache_ports=False,  # jupyter_client's cache would replace the ports set here
            context=self._zmq_context,
        )
        km.owner = owner
        return km

    def _assign_ports(self, replica: Replica) -> None:
        """Give the replica's kernel manager 5 ZMQ ports, and a replicated one a Raft port,
        that no other replica of this agent has.

        Another agent on the same machine may still pick one in the moment before the kernel
        binds it (it binds its Raft port at start too, to hold it until it joins its group);
        `start` then retries with new ports."""
        self._ports_given.difference_update(replica.ports)
        ports = free_ports(self.kernel_ip, len(ZMQ_PORTS), avoid=self._ports_given)
        for name, port in zip(ZMQ_PORTS, ports, strict=True):
            setattr(replica.km, name, port)
        self._ports_given.update(ports)
        replica.ports = ports
        if replica.request.raft:
            raft_port = free_ports(self.raft_ip, 1, avoid=self._ports_given)[0]
            self._ports_given.add(raft_port)
            replica.ports.append(raft_port)
            replica.raft_address = f"{self.raft_ip}:{raft_port}"

    def remove_stale_folders(self) -> list[str]:
        """Remove the folders of replicas that are not this table's and that no running
        process uses (those of an agent that died: its kernels exited with it); return their
        names. Called at agent start."""
        removed = sweep_replica_folders(
            self.replicas_dir, keep=self._replicas, keep_logs_s=self.keep_logs_for
        )
        if removed:
            log.info("removed %d stale replica folder(s) from %s", len(removed), self.replicas_dir)
        return removed

    async def _sweep_later(self) -> list[str]:
        """`remove_stale_folders` while the agent runs: in a worker thread, sparing folders
        changed in the last `SWEEP_MIN_AGE` seconds (a start may be under way)."""
        removed = await asyncio.to_thread(
            sweep_replica_folders,
            self.replicas_dir,
            keep=set(self._replicas),
            keep_logs_s=self.keep_logs_for,
            min_age_s=SWEEP_MIN_AGE,
        )
        if removed:
            log.info("removed %d stale replica folder(s) from %s", len(removed), self.replicas_dir)
        return removed

    async def _discard(self, replica: Replica, *, keep_log: bool = False) -> None:
        """Stop the replica's process (gracefully if it still runs, within about
        ``stop_timeout``; killed otherwise), release its ports and connection file, close its
        log, remove its folder once the process is reaped (all but kernel.log with `keep_log`
        or ``keep_logs_for``; a process still running keeps it whole), and report the change.
        The caller has already removed it from the table. Never raises."""
        self._ports_given.difference_update(replica.ports)
        if replica.state is not ReplicaState.STOPPED:
            replica.move_to(ReplicaState.STOPPED)
        km = replica.km
        if replica.container is not None and self.engine_problem is not None:
            await self._abandon(replica)
            return
        try:
            if await km.is_alive():
                await km.shutdown_kernel(now=False)  # shutdown request, SIGTERM, SIGKILL; cleanup
                log.info("replica %s stopped", replica.id)
            else:
                await _kill_quietly(replica)
                await km.cleanup_resources()
        except Exception:
            log.exception("replica %s: shutdown failed; killing it", replica.id)
            await _kill_quietly(replica)
        if replica.log_file is not None:
            replica.log_file.close()
            replica.log_file = None
        if await process_exit_code(km) is None and _has_process(replica):
            log.warning("replica %s: its process was not reaped; %s stays", replica.id,
                        replica.directory)  # fmt: skip
        else:
            keep = keep_log or self.keep_logs_for > 0
            await asyncio.to_thread(remove_replica_folder, replica.directory, keep_log=keep)
        self._changed()

    async def _abandon(self, replica: Replica) -> None:
        """`_discard` while the engine does not answer: ask the kernel to exit over its
        control channel (its container then exits with it), keep its folder (the container
        may still use it; the sweep or the next agent's start clears what is left)."""
        try:
            await replica.km.request_shutdown()
            await asyncio.sleep(0.2)  # let the request leave before the socket closes
            replica.km.cleanup_connection_file()
        except Exception:
            log.exception("replica %s: could not ask its kernel to exit", replica.id)
        if replica.log_file is not None:
            replica.note(
                f"stopped while the container engine did not answer: {self.engine_problem}"
            )
            replica.log_file.close()
            replica.log_file = None
        log.warning("replica %s: the engine does not answer; its kernel was asked to exit and "
                    "its container is left to the next agent start", replica.id)  # fmt: skip
        self._changed()

    def _check_not_closing(self) -> None:
        if self._closing:
            raise Conflict("this host agent is shutting down")


def _append_log(replica: Replica, data: bytes) -> None:
    """Append what the replica's container wrote to its kernel.log (when it is removed)."""
    if replica.log_file is not None and data:
        replica.log_file.write(data if data.endswith(b"\n") else data + b"\n")
        replica.log_file.flush()


def _has_process(replica: Replica) -> bool:
    provisioner = replica.km.provisioner
    return provisioner is not None and bool(provisioner.has_process)


async def _kill_quietly(replica: Replica) -> int | None:
    """SIGKILL the replica's process group if it still runs and reap it; return its exit code
    (None if there was no process). Leaves ports and the connection file alone, so a later
    restart can reuse them. Never raises."""
    provisioner = replica.km.provisioner
    if provisioner is None or not provisioner.has_process:
        return None
    try:
        if await provisioner.poll() is None:
            await provisioner.kill()
        code = await asyncio.wait_for(provisioner.wait(), timeout=5.0)
        return code if isinstance(code, int) else None
    except Exception:
        log.exception("replica %s: could not kill its process", replica.id)
        return None
