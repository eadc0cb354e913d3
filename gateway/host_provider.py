"""Where new hosts come from: the `HostProvider` interface, and local host-agent processes.

The autoscaler (`kernelfleet.gateway.autoscaler`) asks a provider for hosts and gives them back.
A provider only starts and stops host agents: an agent registers with the gateway by itself,
and the gateway learns that a stopped one is gone when its heartbeats stop. Later providers
(containers, cloud machines) implement the same interface.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from kernelfleet.errors import HostLimitReached, HostUnavailable, NotFound
from kernelfleet.gateway.processes import (
    host_agent_args,
    kill_group,
    log_tail,
    spawn_kernelfleet,
    terminate,
)
from kernelfleet.gateway.store import (
    FORMAT_VERSION,
    StateUnreadable,
    read_json_list,
    write_json_atomically,
)
from kernelfleet.runtime_file import AgentRuntime, pid_alive, read_runtime
from kernelfleet.scheduler.hostkinds import ON_DEMAND, check_kind

log = logging.getLogger("kernelfleet.gateway.hosts.provider")


class HostProvider(abc.ABC):
    """Starts and stops host agents on the autoscaler's behalf.

    Contract: the caller runs one `start_host` or `stop_host` per host at a time, on the
    gateway's event loop, and never stops a host it did not get from `start_host`. `hosts()`
    lists every host started and not yet stopped (starting ones included); `pending()` those
    whose `start_host` has not returned yet. ``max_hosts`` bounds `hosts()` (0: no bound);
    ``gpus_per_host`` is the size of the hosts it adds (0: unknown).
    """

    max_hosts: int = 0
    gpus_per_host: int = 0

    @abc.abstractmethod
    async def start_host(self, kind: str | None = None) -> str:
        """Start one host agent of `kind` (None: the provider's own); return its host id once
        it runs and is about to register.

        Raises `HostLimitReached` at ``max_hosts``, `HostUnavailable` (with the agent's own
        explanation) if it failed to start, and `InvalidRequest` for a kind it cannot start."""

    @abc.abstractmethod
    async def stop_host(self, host_id: str) -> None:
        """Stop a host from `hosts()`, its kernels with it; return once it is gone.
        `NotFound` for any other id."""

    @abc.abstractmethod
    def hosts(self) -> tuple[str, ...]:
        """Ids of the hosts started and not stopped, in start order."""

    @abc.abstractmethod
    def pending(self) -> tuple[str, ...]:
        """Ids of the hosts being started."""

    async def close(self) -> None:
        """Stop every host still running (the gateway is shutting down)."""
        for host_id in reversed(self.hosts()):
            await self.stop_host(host_id)


class LocalProcessHostProvider(HostProvider):
    """Host agents as ``kernelfleet host`` processes on this machine, with virtual GPUs.

    Host ids are ``<prefix>-<n>``; each agent keeps its state in ``<state_dir>/<id>`` and logs
    to ``<state_dir>/logs/<id>.log``. `start_host` returns once the agent listens (it has written
    its runtime file), within ``start_timeout`` seconds; `stop_host` sends SIGTERM (the agent
    stops its kernels) and kills the agent's session after ``stop_timeout`` seconds.

    The hosts it runs are kept in ``<state_dir>/hosts.json`` (id and pid, rewritten after each
    start and stop), so that a gateway restarted after a crash still knows which hosts it
    started and may stop: `adopt` takes back those still running (an agent runs in a session
    of its own and outlives the gateway).

    ``kind``: the kind of the hosts it starts unless `start_host` names one (``on-demand`` or
    ``spot``, told to each agent as ``--kind``); `InvalidRequest` naming it for any other.
    """

    def __init__(
        self,
        gateway_url: str,
        token: str,
        state_dir: Path,
        *,
        gpus_per_host: int = 1,
        max_hosts: int = 0,
        prefix: str = "auto",
        start_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        extra_args: Sequence[str] = (),
        kind: str = ON_DEMAND,
    ) -> None:
        self.kind = check_kind(kind, "the host provider's kind")
        self.gateway_url = gateway_url
        self.state_dir = Path(state_dir)
        self.gpus_per_host = gpus_per_host
        self.max_hosts = max_hosts
        self.prefix = prefix
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self._token = token
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._adopted: dict[str, int] = {}
        """Hosts a previous gateway started that still run: their agents' pids."""
        self._starting: set[str] = set()
        self._counter = 0

    @property
    def hosts_file(self) -> Path:
        """Where the hosts it runs are kept across gateway restarts."""
        return self.state_dir / "hosts.json"

    def adopt(self) -> tuple[str, ...]:
        """Take back the hosts a previous gateway on this state dir started that still run
        (their agent's runtime file names a live pid), and forget the others; return the ids
        taken back. `StateUnreadable`, naming the file, if ``hosts.json`` cannot be read."""
        for entry in read_json_list(self.hosts_file, "hosts"):
            host_id, pid = (
                (entry.get("id"), entry.get("pid")) if isinstance(entry, dict) else (0, 0)
            )
            if not isinstance(host_id, str) or not isinstance(pid, int):
                raise StateUnreadable(
                    f"the state file {self.hosts_file} holds a bad host {entry!r}"
                )
            self._counter = max(self._counter, _number_of(host_id, self.prefix))
            if read_runtime(self.state_dir / host_id, AgentRuntime, pid) is not None:
                self._adopted[host_id] = pid
                log.info(
                    "host agent %s (pid %d), started before a restart, runs: kept", host_id, pid
                )
            else:
                log.warning(
                    "host agent %s (pid %d), started before a restart, is gone", host_id, pid
                )
        self._save()
        return tuple(self._adopted)

    def hosts(self) -> tuple[str, ...]:
        return (*self._adopted, *self._processes)

    def pending(self) -> tuple[str, ...]:
        return tuple(host_id for host_id in self._processes if host_id in self._starting)

    def process(self, host_id: str) -> subprocess.Popen[bytes]:
        """The agent process of a host this provider runs (for tests and diagnostics)."""
        try:
            return self._processes[host_id]
        except KeyError:
            raise NotFound(f"host {host_id!r} was not started by this provider") from None

    async def start_host(self, kind: str | None = None) -> str:
        kind = self.kind if kind is None else check_kind(kind, "the kind of a host to start")
        if self.max_hosts and len(self._processes) >= self.max_hosts:
            raise HostLimitReached(
                f"the local host provider runs {len(self._processes)} host(s), its maximum"
            )
        host_id = self._next_id()
        log_path = self.state_dir / "logs" / f"{host_id}.log"
        args = host_agent_args(
            self.gateway_url,
            host_id,
            self.gpus_per_host,
            self.state_dir / host_id,
            "--kind",
            kind,
            *self.extra_args,
        )
        process = spawn_kernelfleet(args, log_path, self._token)
        self._processes[host_id] = process
        self._starting.add(host_id)
        try:
            await self._wait_listening(host_id, process, log_path)
        except BaseException:
            self._processes.pop(host_id, None)
            await asyncio.to_thread(kill_group, process)
            raise
        finally:
            self._starting.discard(host_id)
        self._save()
        log.info("started host agent %s (%s, pid %d)", host_id, kind, process.pid)
        return host_id

    async def stop_host(self, host_id: str) -> None:
        if host_id in self._adopted:
            await self._stop_adopted(host_id, self._adopted[host_id])
            return
        process = self.process(host_id)
        await asyncio.to_thread(terminate, [process], self.stop_timeout)
        await asyncio.to_thread(kill_group, process)
        del self._processes[host_id]
        self._save()
        log.info("stopped host agent %s (exit code %s)", host_id, process.returncode)

    async def _stop_adopted(self, host_id: str, pid: int) -> None:
        """Stop an agent a previous gateway started (not this process's child): SIGTERM its
        session, SIGKILL it after ``stop_timeout`` seconds."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                break
            await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        del self._adopted[host_id]
        self._save()
        log.info("stopped host agent %s (pid %d, started before a restart)", host_id, pid)

    def _save(self) -> None:
        hosts = [{"id": host_id, "pid": pid} for host_id, pid in self._adopted.items()]
        hosts += [{"id": host_id, "pid": p.pid} for host_id, p in self._processes.items()]
        write_json_atomically(self.hosts_file, {"version": FORMAT_VERSION, "hosts": hosts})

    def _next_id(self) -> str:
        while True:
            self._counter += 1
            host_id = f"{self.prefix}-{self._counter}"
            if host_id not in self._processes and host_id not in self._adopted:
                return host_id

    async def _wait_listening(
        self, host_id: str, process: subprocess.Popen[bytes], log_path: Path
    ) -> None:
        """Until `process` has written its runtime file; a file left by an earlier agent in the
        same state dir names another pid and does not count."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            if read_runtime(self.state_dir / host_id, AgentRuntime, process.pid) is not None:
                return
            if process.poll() is not None:
                raise HostUnavailable(
                    f"host agent {host_id} exited with code {process.returncode} while "
                    f"starting:\n{log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise HostUnavailable(
                    f"host agent {host_id} did not start within {self.start_timeout:.0f} s:\n"
                    f"{log_tail(log_path)}"
                )
            await asyncio.sleep(0.05)


def _number_of(host_id: str, prefix: str) -> int:
    """n of a host id ``<prefix>-<n>``; 0 for any other."""
    number = host_id.removeprefix(f"{prefix}-")
    return int(number) if number != host_id and number.isdigit() else 0
