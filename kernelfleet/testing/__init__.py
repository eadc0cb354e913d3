"""kernelfleet's pytest plugin and test-support package.

Enable with ``pytest_plugins = ["kernelfleet.testing"]``. Fixtures are factories:

- ``fleet_factory(hosts=3, gpus=2, env=None, replicas=1, gateway_args=())`` starts a gateway and
  host agents as subprocesses on ephemeral ports, stopped at the end of the session; ``fleet`` is
  one shared 3-host fleet for tests that do not break it;
- ``private_fleet(...)`` (same arguments) starts a fleet stopped at the end of the test, for tests
  that break it or configure the gateway their own way.

The helpers, importable from here:

- `Fleet`, `start_fleet`, `TOKEN` (`kernelfleet.testing.fleet`): a fleet's processes and API;
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

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kernelfleet.runtime_file import pid_alive
from kernelfleet.testing.deadlines import wait_for, wait_until
from kernelfleet.testing.fleet import TOKEN, Fleet, start_fleet
from kernelfleet.testing.http import call_json
from kernelfleet.testing.processes import descendants, exited_pid, free_port, kill_all
from kernelfleet.testing.stats import percentile
from kernelfleet.testing.websocket import V1_PROTOCOL, KernelWebsocket, Reply

__all__ = [
    "TOKEN",
    "V1_PROTOCOL",
    "Fleet",
    "KernelWebsocket",
    "Reply",
    "call_json",
    "descendants",
    "exited_pid",
    "fleet",
    "fleet_factory",
    "free_port",
    "kill_all",
    "percentile",
    "pid_alive",
    "private_fleet",
    "start_fleet",
    "wait_for",
    "wait_until",
]


def _fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """A `start_fleet` factory, each fleet in a fresh folder; stops them all when resumed."""
    fleets: list[Fleet] = []

    def factory(**kwargs: Any) -> Fleet:
        fleet = start_fleet(tmp_path_factory.mktemp("fleet"), **kwargs)
        fleets.append(fleet)
        return fleet

    try:
        yield factory
    finally:
        for fleet in fleets:
            fleet.stop()


@pytest.fixture(scope="session")
def fleet_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """``fleet_factory(hosts=3, gpus=2, ...)`` starts a fleet (`start_fleet`'s arguments),
    stopped at the session's end."""
    yield from _fleets(tmp_path_factory)


@pytest.fixture(scope="session")
def fleet(fleet_factory: Callable[..., Fleet]) -> Fleet:
    """A shared fleet of 3 hosts x 2 virtual GPUs. Tests must leave it healthy."""
    return fleet_factory(hosts=3, gpus=2)


@pytest.fixture
def private_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Fleet]]:
    """``private_fleet(hosts=..., gpus=..., gateway_args=(...))`` starts a fleet of the test's
    own (`start_fleet`'s arguments), stopped when the test ends."""
    yield from _fleets(tmp_path_factory)
