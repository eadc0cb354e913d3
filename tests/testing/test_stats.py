"""The benchmarks' percentile: nearest rank, over samples in any order."""

from __future__ import annotations

import pytest

from kernelfleet.testing import percentile


def test_nearest_rank_is_a_sample_that_q_percent_do_not_exceed() -> None:
    samples = [float(n) for n in range(100, 0, -1)]  # 100 .. 1, unsorted on purpose
    assert percentile(samples, 50) == 50.0
    assert percentile(samples, 99) == 99.0
    assert percentile(samples, 99.5) == 100.0
    assert percentile(samples, 100) == 100.0
    assert percentile(samples, 0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # never between two samples


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
