"""`coordinate` refuses bad arguments before it starts anything."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from kernelfleet.tools.dataload.coordinate import coordinate, loader_signature


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))


LOADER = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)


@pytest.mark.parametrize(
    ("loader", "group", "consumers", "timeout", "error", "match"),
    [
        ([1, 2, 3], "g", 2, 60.0, TypeError, "needs a torch DataLoader, not list"),
        (DataLoader(Stream()), "g", 2, 60.0, ValueError, "needs a map-style dataset"),
        (LOADER, "", 2, 60.0, ValueError, "group '': 1 to 64 letters"),
        (LOADER, "a/b", 2, 60.0, ValueError, "group 'a/b'"),
        (LOADER, "x" * 65, 2, 60.0, ValueError, "1 to 64"),
        (LOADER, "g", 0, 60.0, ValueError, "consumers must be at least 1, not 0"),
        (LOADER, "g", 2, 0.0, ValueError, "timeout must be a positive number of seconds, not 0.0"),
        (LOADER, "g", 2, float("nan"), ValueError, "timeout must be a positive"),
    ],
)
def test_bad_arguments_are_refused(
    loader: Any, group: str, consumers: int, timeout: float, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        coordinate(loader, group, consumers=consumers, timeout=timeout)


def test_the_signature_names_what_must_be_equal() -> None:
    seeded = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4, shuffle=True,
                        generator=torch.Generator().manual_seed(7))  # fmt: skip
    assert loader_signature(seeded) == {
        "dataset_length": 10,
        "batch_size": 4,
        "drop_last": False,
        "batches": 3,
        "sampler": "RandomSampler",
        "seed": 7,
    }
    assert loader_signature(LOADER)["seed"] is None
