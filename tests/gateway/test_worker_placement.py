"""Placing a cell's tool workers: the executor's host first, then as few hosts as possible."""

from __future__ import annotations

import pytest

from kernelfleet.errors import Conflict
from kernelfleet.gateway.worker_placement import WorkerSlot, place_workers


def test_the_executors_host_comes_first_then_the_largest_hosts() -> None:
    free = {"a": ["0"], "b": ["0", "1"], "c": ["0", "1", "2"], "d": ["5"]}
    slots = place_workers(free, 5, 1, prefer="a")
    assert slots == [
        WorkerSlot("a", ("0",)),
        WorkerSlot("c", ("0",)),
        WorkerSlot("c", ("1",)),
        WorkerSlot("c", ("2",)),
        WorkerSlot("b", ("0",)),
    ]


def test_workers_of_several_gpus_keep_them_on_one_host_and_span_fewest_hosts() -> None:
    free = {"a": ["0", "1", "2"], "b": ["0", "1", "2", "3"], "c": ["0", "1"]}
    slots = place_workers(free, 3, 2, prefer="x")  # an executor with nothing free: ignored
    assert [slot.host_id for slot in slots] == ["b", "b", "a"]
    assert slots[0].device_ids == ("0", "1")
    assert slots[1].device_ids == ("2", "3")


def test_fewest_hosts_is_optimal_against_a_brute_force() -> None:
    import itertools

    free = {"a": ["0"], "b": ["0", "1", "2"], "c": ["0", "1"], "d": ["0", "1", "2", "3"]}
    for count in range(1, 11):
        hosts = {slot.host_id for slot in place_workers(free, count, 1)}
        fewest = min(
            k
            for k in range(1, 5)
            for chosen in itertools.combinations(free, k)
            if sum(len(free[h]) for h in chosen) >= count
        )
        assert len(hosts) == fewest


def test_too_many_gpus_are_refused_with_the_counts() -> None:
    free = {"a": ["0"], "b": ["0", "1"]}
    with pytest.raises(Conflict, match="need 8 GPUs; the fleet has 6"):
        place_workers(free, 4, 2, total=6)
    with pytest.raises(
        Conflict,
        match=r"need 4 GPUs, 2 on one host each; 3 are free now "
        r"\(at most 2 on one host\), room for 1 worker",
    ):
        place_workers(free, 2, 2, total=6)
