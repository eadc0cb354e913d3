"""Where a `runner.WorkerPool`'s worker processes run: on the notebook's own host, or on hosts
of the fleet.

Both launchers start ``python -m kernelfleet.tools.pipeline.worker HOST PORT RANK`` for some of
the pool's ranks, with the run's token in the environment (`channel.TOKEN_ENV`, never on the
command line), and answer the same questions about each rank: has it exited and with what code
(negative: killed by that signal), what did it last print, where does it run; `close` ends them
all. The pool talks to its workers over TCP either way; only starting, watching and ending
differ:

- `LocalWorkers`: child processes of the notebook (`subprocess.Popen`), each seeing one of the
  GPUs the cell holds (``CUDA_VISIBLE_DEVICES``), or none (the CPU);
- `FleetWorkers`: tool workers the gateway starts for the kernel's running cell
  (``POST /api/fleet/kernels/{id}/workers``, with the kernel's own token), one GPU each, on
  the hosts it chooses; their states and log tails come from the gateway, and ending them
  (``DELETE``) frees their GPUs. The gateway ends them too when the cell ends. The driver polls
  the gateway less often while nothing changes (`next_poll_s`); the gateway asks the agents for
  the log tails of exited workers only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any, Protocol

from kernelfleet.client import ClientError, FleetClient

WORKER_MODULE = "kernelfleet.tools.pipeline.worker"
UNKNOWN_EXIT = 255
"""The exit code reported for a fleet worker whose code nobody knows (its host was lost)."""
CLOSE_GRACE_S = 5.0
"""How long a graceful close waits for the workers to leave by themselves."""


class Workers(Protocol):
    """Worker processes of some ranks of a pool."""

    ranks: tuple[int, ...]
    notice_s: float
    """How long after a worker dies its exit code may take to show (`exit_code`)."""

    def exit_code(self, rank: int) -> int | None:
        """Its exit code (negative: the signal that killed it); None while it runs."""

    def log_tail(self, rank: int) -> str:
        """The end of what it printed (stdout and stderr)."""

    def where(self, rank: int) -> str:
        """Where it runs, for messages: ``""`` on the notebook's host."""

    def close(self, graceful: bool) -> None:
        """End every worker: gracefully, they get a moment to leave first."""


def next_poll_s(interval: float, changed: bool, least: float, most: float) -> float:
    """The wait before the next poll of a state after one `interval` s long: back to `least`
    when the last poll saw a change, else twice as long, up to `most`."""
    return least if changed else min(most, max(least, interval * 2))


def wait_exit(workers: Workers, rank: int, timeout: float) -> int | None:
    """The rank's exit code once it exited, or None if it still runs after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        code = workers.exit_code(rank)
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.05)


class LocalWorkers:
    """Ranks `ranks` as child processes; rank ``r`` sees GPU ``gpus[i]`` (its position ``i``
    in `ranks`), or no GPU when `gpus` is empty."""

    notice_s = 0.5

    def __init__(
        self, ranks: Sequence[int], host: str, port: int, token: str, gpus: Sequence[str]
    ) -> None:
        from kernelfleet.tools.pipeline.channel import TOKEN_ENV

        self.ranks = tuple(ranks)
        self.logs: dict[int, IO[bytes]] = {}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for index, rank in enumerate(self.ranks):
                env = dict(os.environ)
                env[TOKEN_ENV] = token
                env["CUDA_VISIBLE_DEVICES"] = gpus[index] if gpus else ""
                log = tempfile.TemporaryFile()  # noqa: SIM115 (open until close())
                self.logs[rank] = log
                command = [sys.executable, "-m", WORKER_MODULE, host, str(port), str(rank)]
                self.processes[rank] = subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
        except BaseException:
            self.close(graceful=False)
            raise

    def exit_code(self, rank: int) -> int | None:
        return self.processes[rank].poll()

    def log_tail(self, rank: int, size: int = 2000) -> str:
        log = self.logs[rank]
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - size))
        return log.read().decode(errors="replace").rstrip()

    def where(self, rank: int) -> str:
        return ""

    def close(self, graceful: bool) -> None:
        for process in self.processes.values():
            try:
                process.wait(timeout=CLOSE_GRACE_S if graceful else 0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self.logs.values():
            log.close()


class FleetWorkers:
    """Ranks `ranks` as tool workers the fleet starts (one GPU each, on hosts the gateway
    chooses), through `client` (the kernel's `FleetClient`). Raises the client's errors
    (`kernelfleet.client.FleetApiError`: too few GPUs free, say, with the counts) if the
    gateway does not start them."""

    REFRESH_MIN_S = 0.25
    """The group's state is asked of the gateway at most this often ..."""
    REFRESH_MAX_S = 1.0
    """... and, while it does not change (`next_poll_s`), at least this often."""
    notice_s = 3.0
    """An exit reaches the driver through its agent's report to the gateway (sent at once),
    then a poll (at most `REFRESH_MAX_S` later)."""

    def __init__(
        self, client: FleetClient, ranks: Sequence[int], host: str, port: int, token: str
    ) -> None:
        from kernelfleet.tools.pipeline.channel import TOKEN_ENV

        self.ranks = tuple(ranks)
        self.client = client
        self.group: dict[str, Any] = client.start_workers(
            len(self.ranks),
            WORKER_MODULE,
            args=[host, str(port)],
            args_each=[[str(rank)] for rank in self.ranks],
            env={TOKEN_ENV: token},
        )
        self.closed = False
        self.polls = 0
        """How many times the group's state was asked of the gateway."""
        self._asked = time.monotonic()
        self._poll_s = self.REFRESH_MIN_S

    @property
    def group_id(self) -> str:
        return str(self.group["id"])

    def hosts(self) -> dict[int, tuple[str, tuple[str, ...]]]:
        """Rank -> the host it runs on and its devices there."""
        return {
            self.ranks[w["index"]]: (w["host"], tuple(w["devices"])) for w in self.group["workers"]
        }

    def exit_code(self, rank: int) -> int | None:
        worker = self._worker(rank, fresh_after=self._poll_s)
        if worker["state"] != "exited":
            return None
        code = worker["exit_code"]
        return code if isinstance(code, int) else UNKNOWN_EXIT

    def log_tail(self, rank: int) -> str:
        return "\n".join(self._worker(rank, fresh_after=0.0)["log_tail"]).rstrip()

    def where(self, rank: int) -> str:
        host, devices = self.hosts()[rank]
        return f" on host {host} (GPU {','.join(devices)})"

    def close(self, graceful: bool) -> None:
        """Give the workers a moment to leave (gracefully), then end the group: the gateway
        stops what still runs and frees the GPUs. Never raises: a gateway that cannot be
        reached ends the group itself when the cell ends."""
        if self.closed:
            return
        self.closed = True
        if graceful:
            deadline = time.monotonic() + CLOSE_GRACE_S
            with contextlib.suppress(ClientError):
                while time.monotonic() < deadline and any(
                    self.exit_code(rank) is None for rank in self.ranks
                ):
                    time.sleep(0.1)
        with contextlib.suppress(ClientError):
            self.group = self.client.stop_workers(self.group_id)

    def _worker(self, rank: int, fresh_after: float) -> dict[str, Any]:
        if not self.closed and time.monotonic() - self._asked >= fresh_after:
            before, self.group = self.group, self.client.workers(self.group_id)
            self._asked, self.polls = time.monotonic(), self.polls + 1
            changed = _states(before) != _states(self.group)
            self._poll_s = next_poll_s(
                self._poll_s, changed, self.REFRESH_MIN_S, self.REFRESH_MAX_S
            )
        index = self.ranks.index(rank)
        worker: dict[str, Any] = next(w for w in self.group["workers"] if w["index"] == index)
        return worker


def _states(group: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a poll watches for: each worker's state and exit code."""
    return [(w["index"], w["state"], w["exit_code"]) for w in group["workers"]]
