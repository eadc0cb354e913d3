"""Where new hosts come from: the `HostProvider` interface, and local host-agent processes.

The autoscaler (`kernelfleet.gateway.autoscaler`) asks a provider for hosts and gives them back.
A provider only starts and stops host agents: an agent registers with the gateway by itself,
and the gateway learns that a stopped one is gone when its heartbeats stop. Later providers
(containers, cloud machines) implement the same interface.
"""

from __future__ import annotations

import abc
import asyncio
import logging
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
from kernelfleet.runtime_file import AgentRuntime, read_runtime

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
    async def start_host(self) -> str:
        """Start one host agent; return its host id once it runs and is about to register.

        Raises `HostLimitReached` at ``max_hosts`` and `HostUnavailable` (with the agent's
        own explanation) if it failed to start."""

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
    ) -> None:
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
        self._starting: set[str] = set()
        self._counter = 0

    def hosts(self) -> tuple[str, ...]:
        return tuple(self._processes)

    def pending(self) -> tuple[str, ...]:
        return tuple(host_id for host_id in self._processes if host_id in self._starting)

    def process(self, host_id: str) -> subprocess.Popen[bytes]:
        """The agent process of a host this provider runs (for tests and diagnostics)."""
        try:
            return self._processes[host_id]
        except KeyError:
            raise NotFound(f"host {host_id!r} was not started by this provider") from None

    async def start_host(self) -> str:
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
        log.info("started host agent %s (pid %d)", host_id, process.pid)
        return host_id

    async def stop_host(self, host_id: str) -> None:
        process = self.process(host_id)
        await asyncio.to_thread(terminate, [process], self.stop_timeout)
        await asyncio.to_thread(kill_group, process)
        del self._processes[host_id]
        log.info("stopped host agent %s (exit code %s)", host_id, process.returncode)

    def _next_id(self) -> str:
        while True:
            self._counter += 1
            host_id = f"{self.prefix}-{self._counter}"
            if host_id not in self._processes:
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
