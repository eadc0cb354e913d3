"""Where PipeDream's published profiles are: ``../shared/data/pipedream/profiles`` beside the
repository (tests that need them are skipped, saying so, where it is absent)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
