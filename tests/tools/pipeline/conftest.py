"""Where PipeDream's published profiles are: ``../shared/data/pipedream/profiles`` beside the
repository (tests that need them are skipped, saying so, where it is absent); and the pools of
worker processes the run tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kernelfleet

PROFILES = (
    Path(kernelfleet.__file__).resolve().parent.parent.parent
    / "shared"
    / "data"
    / "pipedream"
    / "profiles"
)


@pytest.fixture
def pipedream_profile() -> Callable[[str], Path]:
    """``pipedream_profile("vgg16")``: the path of that model's ``graph.txt``."""

    def path(model: str) -> Path:
        graph = PROFILES / model / "graph.txt"
        if not graph.is_file():
            pytest.skip(
                f"PipeDream's profiles are not at {PROFILES} (../shared/data beside the repo)"
            )
        return graph

    return path


@pytest.fixture(scope="package")
def pools() -> Iterator[Callable[[int], Any]]:
    """``pools(ranks)``: a running `WorkerPool` of that many CPU workers, shared by the tests of
    this package (a new one if the last was closed by a failure); all are closed at the end."""
    from kernelfleet.tools.pipeline.runner import WorkerPool

    running: dict[int, WorkerPool] = {}

    def pool(ranks: int) -> WorkerPool:
        if ranks not in running or running[ranks].closed:
            running[ranks] = WorkerPool(ranks, timeout_s=60, gpus=[])
        return running[ranks]

    yield pool
    for each in running.values():
        each.close()
