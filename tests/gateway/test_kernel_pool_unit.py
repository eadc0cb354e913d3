"""The warm pool's decisions, with a fake placement (the live behaviour is in
test_kernel_pool.py): which starts it serves, and a pool that cannot be refilled."""

import asyncio
import logging
from types import SimpleNamespace

import pytest

from kernelfleet.errors import NoCapacity
from kernelfleet.gateway.kernel_pool import KernelPool, pool_target
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import KernelRecord

LAUNCH = ("kernelfleet-python3", 3)


class NoRoom:
    """A placement with no capacity: every host is taken."""

    def place(self, kernel):
        raise NoCapacity("no 3 hosts take work (1 alive)")


class OneHost:
    """A registry of one host, alive, which takes work."""

    def all(self):
        return [SimpleNamespace(id="host-1", takes_work=True)]


def pool(size=1):
    return KernelPool(size, "python3", LAUNCH, NoRoom(), None, OneHost(), None, FleetMetrics())


def start(env=None, launch=LAUNCH, gpus=0):
    return KernelRecord(
        id="k-1", name="python3", env=env or {}, launch_name=launch[0],
        replicas_wanted=launch[1], gpus=gpus,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("size", "kernel", "per_session", "why"),
    [
        (0, start(), False, "the pool is off"),
        (1, start(launch=("python3", 1)), False, "not 'python3' x1"),
        (1, start(env={"PYTHONPATH": "/x", "KERNEL_A": "1"}), False, "env PYTHONPATH"),
        (1, start(gpus=1), True, "whole life"),
    ],
)
def test_a_start_the_pool_cannot_serve_says_why(size, kernel, per_session, why):
    assert why in pool(size).unfit(kernel, per_session)


def test_the_pool_serves_the_default_launch_with_kernel_env_and_gpus_per_cell():
    env = {"KERNEL_WORKING_DIR": "/srv", "KERNEL_USERNAME": "a", "KERNEL_GPUS": "1"}
    assert pool().unfit(start(env=env, gpus=1), per_session=False) is None


async def test_a_pool_that_cannot_be_refilled_logs_why_once_and_starts_cold(caplog):
    caplog.set_level(logging.INFO, "kernelfleet.gateway.pool")
    warm = pool()
    refill = asyncio.ensure_future(warm.run())
    await asyncio.sleep(0.05)
    warm._wake.set()  # a second round, with the same reason
    await asyncio.sleep(0.05)
    refill.cancel()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        "the kernel pool cannot be refilled now: no capacity for a pooled group "
        "(no 3 hosts take work (1 alive)); kernel starts are cold"
    ]
    assert await warm.take(start()) is None
    assert "the pool is empty, so it starts cold" in caplog.text


async def test_a_pool_waits_quietly_for_the_first_host(caplog):
    caplog.set_level(logging.INFO, "kernelfleet.gateway.pool")
    warm = KernelPool(1, "python3", LAUNCH, NoRoom(), None, NoHost(), None, FleetMetrics())
    refill = asyncio.ensure_future(warm.run())
    await asyncio.sleep(0.05)
    refill.cancel()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class NoHost:
    """A registry before any agent registered."""

    def all(self):
        return []


@pytest.mark.parametrize(
    ("starts", "refill_s", "floor", "ceiling", "target"),
    [
        ([], 2.0, 1, 4, 1),  # no demand seen: the floor
        ([0.0, 10.0, 20.0], 2.0, 1, 4, 1),  # one at a time: one group serves each
        ([0.0, 0.5, 1.0, 10.0], 2.0, 1, 4, 3),  # a burst of 3 within one refill
        ([0.0, 0.5, 1.0, 2.5, 3.0], 2.0, 1, 4, 3),  # the burst is the densest window, not all
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 2.0, 1, 4, 4),  # never above the ceiling
        ([0.0, 0.1], 2.0, 3, 4, 3),  # never below the floor
    ],
)
def test_the_pool_target_is_the_largest_burst_within_one_refill(
    starts, refill_s, floor, ceiling, target
):
    assert pool_target(starts, refill_s, floor, ceiling) == target


async def test_a_pool_grows_after_a_burst_of_starts_only_up_to_its_ceiling():
    fixed = pool(size=1)
    growing = KernelPool(
        1, "python3", LAUNCH, NoRoom(), None, OneHost(), None, FleetMetrics(), ceiling=3
    )
    for each in (fixed, growing):
        each._fill_times.append(2.0)  # a group takes 2 s to start
        for _ in range(5):  # a burst: nothing ready, every start is cold
            assert await each.take(start()) is None
    assert (fixed.target, growing.target) == (1, 3)
