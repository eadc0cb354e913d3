"""The waiting-order rule on plain data: which host's free GPUs are kept for an older cell."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kernelfleet.scheduler.waiting import WaitingCell, held_for_elders


@dataclass(frozen=True)
class Elder:
    gpus: int
    hosts: frozenset[str] | None


def on(*hosts: str) -> frozenset[str]:
    return frozenset(hosts)


def test_a_host_an_older_cell_could_run_on_is_kept_for_it() -> None:
    # a 2-GPU cell waits for h1 or h2; a newer 1-GPU cell may not take h2's free GPU
    elders = [Elder(2, on("h1", "h2"))]
    assert held_for_elders("h2", 1, elders)
    assert not held_for_elders("h3", 1, elders)


def test_nothing_is_held_without_elders() -> None:
    assert not held_for_elders("h1", 4, [])


def test_any_one_elder_is_enough() -> None:
    elders = [Elder(1, on("h1")), Elder(1, on("h3")), Elder(2, on("h2"))]
    assert held_for_elders("h2", 1, elders)
    assert held_for_elders("h3", 1, elders)
    assert not held_for_elders("h4", 1, elders)


@pytest.mark.parametrize(
    "why", ["it needs no GPU", "it runs on GPUs its kernel holds (per-session binding)"]
)
def test_a_cell_that_takes_no_free_gpu_is_never_held(why: str) -> None:
    assert not held_for_elders("h1", 0, [Elder(2, on("h1")), Elder(1, None)]), why


def test_an_elder_that_needs_no_gpu_holds_nothing() -> None:
    assert not held_for_elders("h1", 1, [Elder(0, on("h1")), Elder(0, None)])


def test_an_elder_without_replicas_holds_every_host() -> None:
    # a kernel without replicas (fcfs-batch) runs its cells wherever GPUs are free
    assert held_for_elders("h7", 1, [Elder(1, None)])


def test_an_elder_with_no_host_holds_none() -> None:
    # an empty set is "nowhere", not "anywhere": only None means any host
    assert not held_for_elders("h1", 1, [Elder(1, on())])


def test_elders_may_be_a_generator_read_up_to_the_first_that_holds() -> None:
    read: list[int] = []

    def elders() -> Iterator[WaitingCell]:
        for index, elder in enumerate([Elder(1, on("h2")), Elder(1, on("h1")), Elder(1, None)]):
            read.append(index)
            yield elder

    assert held_for_elders("h1", 1, elders())
    assert read == [0, 1]
