"""kernelfleet's pytest plugin and test-support package.

Enable with ``pytest_plugins = ["kernelfleet.testing"]``. Fixtures are factories:

- ``fleet_factory(hosts=3, gpus=2, env=None, replicas=1, gateway_args=(), gpu_speeds=())``
  starts a gateway and host agents (``gpu_speeds``: each host's ``--gpu-speed``) as subprocesses
  on ephemeral ports, stopped at the end of the session; ``fleet`` is one shared 3-host fleet
  for tests that do not break it;
- ``private_fleet(...)`` (same arguments) starts a fleet stopped at the end of the test, for tests
  that break it or configure the gateway their own way;
- ``kernelfleet_up(*args)`` runs ``kernelfleet up ARGS`` (``"--hosts", "1"``...), as a user
  does, stopped at the end of the test (`kernelfleet.testing.up`).

The helpers, importable from here:

- `Fleet`, `start_fleet`, `TOKEN` (`kernelfleet.testing.fleet`): a fleet's processes and API;
  `kernel_reachable_folder`: a folder for a fleet whose kernels run as users of their own;
- `Up`, `start_up` (`.up`): a ``kernelfleet up`` subprocess, its URL, token and API;
- `KernelWebsocket`, `Reply` (`.websocket`): a kernel client over the gateway's websocket;
- `call_json` (`.http`): one call to a token-protected JSON API;
- `wait_for`, `wait_until` (`.deadlines`): poll a condition until a deadline, sync or async;
- `free_port`, `descendants`, `exited_pid`, `kill_all` (`.processes`): ports and process trees;
- `percentile` (`.stats`): the benchmarks' nearest-rank percentile;
- `pid_alive`: production's own (`kernelfleet.runtime_file`), as tests must use it.

Helpers that reach one replica past the gateway (a cell, its status, its namespace digest) are
in `kernelfleet.testing.replicas`, imported by the tests that need them.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.runtime_file import pid_alive
from kernelfleet.testing.deadlines import wait_for, wait_until
from kernelfleet.testing.fleet import TOKEN, Fleet, kernel_reachable_folder, start_fleet
from kernelfleet.testing.http import call_json
from kernelfleet.testing.processes import descendants, exited_pid, free_port, kill_all
from kernelfleet.testing.stats import percentile
from kernelfleet.testing.up import Up, start_up
from kernelfleet.testing.websocket import V1_PROTOCOL, KernelWebsocket, Reply

__all__ = [
    "TOKEN",
    "V1_PROTOCOL",
    "Fleet",
    "KernelWebsocket",
    "Reply",
    "Up",
    "call_json",
    "descendants",
    "exited_pid",
    "fleet",
    "fleet_factory",
    "free_port",
    "kernel_reachable_folder",
    "kernelfleet_up",
    "kill_all",
    "percentile",
    "pid_alive",
    "private_fleet",
    "start_fleet",
    "start_up",
    "wait_for",
    "wait_until",
]


def _fleets() -> Iterator[Callable[..., Fleet]]:
    """A `start_fleet` factory, each fleet in a fresh folder that kernels running as users of
    their own can reach (`kernel_reachable_folder`); stops them all and removes their folders
    when resumed."""
    fleets: list[Fleet] = []
    folders: list[Path] = []

    def factory(**kwargs: Any) -> Fleet:
        folders.append(kernel_reachable_folder())
        fleet = start_fleet(folders[-1], **kwargs)
        fleets.append(fleet)
        return fleet

    try:
        yield factory
    finally:
        for fleet in fleets:
            fleet.stop()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def fleet_factory() -> Iterator[Callable[..., Fleet]]:
    """``fleet_factory(hosts=3, gpus=2, ...)`` starts a fleet (`start_fleet`'s arguments),
    stopped at the session's end."""
    yield from _fleets()


@pytest.fixture(scope="session")
def fleet(fleet_factory: Callable[..., Fleet]) -> Fleet:
    """A shared fleet of 3 hosts x 2 virtual GPUs. Tests must leave it healthy."""
    return fleet_factory(hosts=3, gpus=2)


@pytest.fixture
def private_fleet() -> Iterator[Callable[..., Fleet]]:
    """``private_fleet(hosts=..., gpus=..., gateway_args=(...))`` starts a fleet of the test's
    own (`start_fleet`'s arguments), stopped when the test ends."""
    yield from _fleets()


@pytest.fixture
def kernelfleet_up() -> Iterator[Callable[..., Up]]:
    """``kernelfleet_up("--hosts", "1", ...)`` runs ``kernelfleet up`` with those options and a
    random token in a fresh folder that kernels running as users of their own can reach; each
    is stopped (SIGTERM, as Ctrl-C) and its folder removed when the test ends."""
    started: list[Up] = []
    folders: list[Path] = []

    def factory(*args: str) -> Up:
        folders.append(kernel_reachable_folder())
        started.append(start_up(folders[-1], *args, token=secrets.token_hex(24)))
        return started[-1]

    try:
        yield factory
    finally:
        for up in started:
            up.stop()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
