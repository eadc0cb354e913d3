"""DS-Analyzer's differential measurement, for real on a loader with synthetic costs: the prep
stall grows with the decode cost, the fetch stall shows the fetch cost."""

from __future__ import annotations

from typing import Any

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.dataload.analyze import Analysis, analyze, is_staged, render
from kernelfleet.tools.dataload.synthetic import SyntheticDataset

torch = pytest.importorskip("torch")
BATCH = 4
FETCH_S = 0.005  # sleeping and spinning last at least this long, however busy the host


def small_model() -> Any:
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def measure(decode_s: float, workers: int = 0) -> Analysis:
    dataset = SyntheticDataset(40, item_bytes=64, fetch_s=FETCH_S, decode_s=decode_s)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=workers
    )
    return analyze(loader, small_model(), batches=8, drop_page_cache=False)


def test_prep_stall_grows_with_the_decode_cost() -> None:
    cheap, costly = measure(0.0), measure(0.010)
    # in the loop's own thread (no workers) the step waits for every item's decode
    assert costly.prep_stall_s - cheap.prep_stall_s >= 0.5 * BATCH * 0.010
    assert costly.prep_stall_fraction > cheap.prep_stall_fraction
    for analysis in (cheap, costly):
        assert analysis.fetch_stall_s >= 0.5 * BATCH * FETCH_S  # slept for, not prepared
        assert analysis.cached_mode == "raw items in memory"
        assert analysis.cold_mode.startswith("as found")
        assert analysis.cpus == 1
        assert analysis.batches_per_epoch == 10
        profile = analysis.profile
        assert profile.compute_s == analysis.synthetic_s
        assert profile.prep_cpu_s == analysis.prep_only_s
        assert profile.fetch_s == analysis.fetch_stall_s
        assert profile.dataset_bytes > 40 * 64
    text = render(costly, [1, 2, 4], [0, costly.dataset_bytes])
    assert "prep stall" in text
    assert "fetch stall" in text
    assert f"{costly.profile.epoch_s(2, 0):>14.2f}" in text.splitlines()[-2]


def test_any_map_style_dataset_with_loader_workers() -> None:
    data = [(torch.full((64,), float(i)), i % 10) for i in range(40)]
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1)
    analysis = analyze(loader, small_model(), batches=4, drop_page_cache=False, cores=2)
    assert not is_staged(data)
    assert analysis.cached_mode == "page cache warmed by the cold pass"
    assert analysis.workers == 1
    assert analysis.cpus == 1
    assert min(analysis.cold_s, analysis.cached_s, analysis.synthetic_s) > 0


def test_a_step_function_is_called_with_each_minibatch() -> None:
    seen: list[int] = []
    data = list(range(12))
    loader = torch.utils.data.DataLoader(data, batch_size=3)
    analyze(loader, lambda batch: seen.append(len(batch)), batches=2, drop_page_cache=False)
    # cold 2 minibatches, synthetic 1 more step, cached 2; prep only calls no step
    assert seen == [3] * 5


def test_what_it_cannot_measure_is_refused() -> None:
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
    with pytest.raises(InvalidRequest, match="at least 2 minibatches"):
        analyze(loader, small_model(), batches=1)
    with pytest.raises(InvalidRequest, match="fewer than 3"):
        analyze(loader, small_model(), batches=3, drop_page_cache=False)
    with pytest.raises(InvalidRequest, match="batching torch DataLoader"):
        analyze([1, 2, 3], small_model(), batches=2)
    with pytest.raises(InvalidRequest, match="Module or a callable"):
        analyze(loader, 42, batches=2)
