"""The what-if model, figure by figure as its docstring states it."""

from __future__ import annotations

import pytest

from kernelfleet.tools.dataload.whatif import StallProfile

PROFILE = StallProfile(
    compute_s=0.010, prep_cpu_s=0.040, fetch_s=0.020, batches_per_epoch=100, dataset_bytes=1e9
)


@pytest.mark.parametrize(
    ("cpus", "cache_bytes", "batch_s"),
    [
        (1, 0, 0.040 + 0.020),  # prep bound, nothing cached
        (2, 0, 0.020 + 0.020),  # prep halves with twice the CPUs
        (4, 0, 0.010 + 0.020),  # prep hidden behind the compute: 4 CPUs suffice
        (16, 0, 0.010 + 0.020),  # more CPUs do not beat the compute
        (4, 0.25e9, 0.010 + 0.75 * 0.020),  # a quarter cached: a quarter less fetching
        (4, 0.5e9, 0.010 + 0.5 * 0.020),
        (4, 1e9, 0.010),  # all cached: no fetch stall at all
        (4, 5e9, 0.010),  # a cache beyond the dataset changes nothing more
        (1, 1e9, 0.040),
    ],
)
def test_batch_time_is_the_slower_of_compute_and_prep_plus_the_uncached_fetch(
    cpus: int, cache_bytes: float, batch_s: float
) -> None:
    assert PROFILE.batch_s(cpus, cache_bytes) == pytest.approx(batch_s)
    assert PROFILE.epoch_s(cpus, cache_bytes) == pytest.approx(100 * batch_s)


def test_stalls_are_the_time_beyond_compute() -> None:
    assert PROFILE.stalls(1) == pytest.approx((100 * 0.030, 100 * 0.020))
    assert PROFILE.stalls(8, 0.5e9) == pytest.approx((0.0, 100 * 0.010))
    prep, fetch = PROFILE.stalls(2, 0.25e9)
    assert PROFILE.epoch_s(2, 0.25e9) == pytest.approx(100 * PROFILE.compute_s + prep + fetch)


def test_epoch_time_never_rises_with_cpus_or_cache() -> None:
    times = [[PROFILE.epoch_s(n, c * 1e8) for c in range(12)] for n in range(1, 9)]
    for row in times:
        assert row == sorted(row, reverse=True)
    for column in zip(*times, strict=True):
        assert list(column) == sorted(column, reverse=True)


def test_cached_fraction_is_minios_share_of_the_dataset() -> None:
    assert PROFILE.cached_fraction(0) == 0
    assert PROFILE.cached_fraction(3e8) == pytest.approx(0.3)
    assert PROFILE.cached_fraction(2e9) == 1
    assert StallProfile(0.1, 0.1, 0.1, 1, dataset_bytes=0).cached_fraction(0) == 1


def test_bad_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="no negative"):
        StallProfile(-1, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="at least one CPU"):
        PROFILE.batch_s(0)
