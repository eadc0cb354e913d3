"""Batch-size dynamics of Shockwave's trace jobs and the Dirichlet posterior over them."""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from kernelfleet.scheduler.jobs.dynamics import (
    BatchSizePosterior,
    DynamicThroughput,
    parse_job_type,
    profiled_alone_s,
    profiled_batch_sizes,
    scheduled_batch_size,
    steps_per_epoch,
)

SHOCKWAVE_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "shockwave"


def table_lookup(rows: Mapping[tuple[str, int], Mapping[str, float]]):
    return lambda job_type, gpus: rows.get((job_type, gpus))


def tacc_lookup():
    """The isolated figures ("null") of Shockwave's TACC throughput table, as a lookup."""
    path = SHOCKWAVE_DATA / "tacc_throughputs.json"
    if not path.is_file():
        pytest.fail(f"Shockwave's throughput table is missing: looked for {path}")
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for gpu_type, entries in json.loads(path.read_text()).items():
        for key, entry in entries.items():
            job_type, gpus = ast.literal_eval(key)
            rows.setdefault((job_type, gpus), {})[gpu_type] = entry["null"]
    return table_lookup(rows)


def test_job_types_name_their_model_and_batch_size():
    assert parse_job_type("ResNet-18 (batch size 32)") == ("ResNet-18", 32)
    assert parse_job_type("Recommendation (batch size 8192)") == ("Recommendation", 8192)
    assert parse_job_type("A3C") == ("A3C", None)


@pytest.mark.parametrize(
    ("epochs_done", "batch_size"),
    [(0.0, 32), (19.0, 32), (19.5, 64), (29.5, 128), (49.5, 256), (500.0, 256)],
)
def test_gns_doubles_one_epoch_ahead_of_its_pattern_and_stops_at_the_largest(
    epochs_done, batch_size
):
    # ResNet-18 at 32 on one GPU: x2 from epoch 21, x4 from 31, x8 from 51 (capped at 256);
    # during epoch 19.5 the counter is 20 and GNS looks at epoch 21 already.
    assert scheduled_batch_size("gns", "ResNet-18", 32, 1, epochs_done) == batch_size


@pytest.mark.parametrize(
    ("epochs_done", "batch_size"), [(0.5, 32), (9.0, 32), (9.5, 128), (28.5, 128), (29.5, 32)]
)
def test_accordion_keeps_the_small_batch_inside_critical_regimes(epochs_done, batch_size):
    # ResNet-50's critical regimes are epoch counters 0-9 of every 30; during epoch 29.5 the
    # counter (ceil) is already 30.
    assert scheduled_batch_size("accordion", "ResNet-50", 32, 1, epochs_done) == batch_size


def test_static_jobs_and_jobs_born_at_the_largest_batch_keep_it():
    assert scheduled_batch_size("static", "ResNet-18", 32, 1, 500.0) == 32
    assert scheduled_batch_size("gns", "LM", 80, 1, 500.0) == 80
    assert scheduled_batch_size("accordion", "Transformer", 64, 1, 500.0) == 64


def test_throughput_counts_trace_steps_so_an_epoch_is_the_same_work_at_any_batch_size():
    lookup = table_lookup(
        {
            ("ResNet-18 (batch size 32)", 1): {"v100": 20.0},
            ("ResNet-18 (batch size 256)", 1): {"v100": 5.0},
        }
    )
    job = DynamicThroughput.build("ResNet-18 (batch size 32)", 1, 200 * 1563, "accordion", lookup)
    assert steps_per_epoch("ResNet-18", 32) == 1563
    assert steps_per_epoch("ResNet-18", 256) == 196
    assert job.epochs == 200
    assert job.batch_size(5 * 1563) == 32
    assert job.steps_per_s("v100", 5 * 1563) == 20.0
    # epoch 20.5: outside the critical regime; 5 steps/s of 196 steps per epoch, in trace steps
    assert job.batch_size(20.5 * 1563) == 256
    assert job.steps_per_s("v100", 20.5 * 1563) == pytest.approx(5.0 * 1563 / 196)
    assert job.steps_per_s("k80", 20.5 * 1563) == 0.0
    assert job.regimes() == (32, 256)
    assert job.regime_throughputs() == {32: {"v100": 20.0}, 256: {"v100": 5.0 * 1563 / 196}}


def test_a_batch_size_missing_from_the_table_is_never_reached():
    lookup = table_lookup(
        {
            ("LM (batch size 10)", 1): {"v100": 30.0},
            ("LM (batch size 20)", 1): {"v100": 25.0},
        }
    )
    job = DynamicThroughput.build("LM (batch size 10)", 1, 10**7, "gns", lookup)
    # the pattern wants 40 from epoch 21 and 80 from 41; GNS doubles and stops at 20
    assert job.batch_size(50 * steps_per_epoch("LM", 10)) == 20
    assert job.regimes() == (10, 20)


def test_an_accordion_profile_warms_up_for_30_percent_of_the_epochs():
    profile = profiled_batch_sizes("accordion", "LM", 10, 1, 100)
    # LM's critical regime is epochs 0-9, but the profile keeps 10 up to epoch 30 (30 % of 100)
    assert profile[:31] == (10,) * 31
    assert profile[31:] == (80,) * 69
    # the simulator's Accordion leaves the regime at epoch 10
    assert scheduled_batch_size("accordion", "LM", 10, 1, 10.5) == 80


def test_a_recommendation_accordion_profile_has_two_late_critical_regimes():
    profile = profiled_batch_sizes("accordion", "Recommendation", 4096, 1, 100)
    small = [epoch for epoch, size in enumerate(profile) if size == 4096]
    assert small == [*range(31), *range(60, 70), *range(80, 90)]


def test_a_gns_profile_doubles_at_its_epochs_and_ends_at_the_initial_batch_size():
    # ("LM", 10, 1) doubles from epochs 11, 21 and 41
    profile = profiled_batch_sizes("gns", "LM", 10, 1, 50)
    assert profile[:11] == (10,) * 11
    assert profile[11:21] == (20,) * 10
    assert profile[21:41] == (40,) * 20
    assert profile[41:49] == (80,) * 8
    assert profile[49] == 10  # the last epoch, past the first doubling's range
    assert profiled_batch_sizes("gns", "LM", 10, 1, 15)[-1] == 20  # inside it: doubled
    assert profiled_batch_sizes("static", "LM", 10, 1, 3) == (10, 10, 10)


def test_a_profile_s_time_alone_counts_unrounded_iterations_at_the_table_s_figures():
    lookup = table_lookup(
        {("LM (batch size 10)", 1): {"v100": 30.0}, ("LM (batch size 80)", 1): {"v100": 20.0}}
    )
    seconds = profiled_alone_s("accordion", "LM", 10, 1, 100, lookup)
    assert seconds == {"v100": pytest.approx(31 * 59675 / 10 / 30.0 + 69 * 59675 / 80 / 20.0)}
    assert profiled_alone_s("accordion", "LM", 5, 1, 100, lookup) == {}  # no row for 5


def test_the_tacc_trace_types_build_from_shockwave_s_own_table():
    lookup = tacc_lookup()
    job = DynamicThroughput.build("LM (batch size 10)", 1, 134583, "gns", lookup)
    assert job.epochs == 23  # ceil(134583 / ceil(59675 / 10))
    assert job.regimes() == (10, 20, 40)
    no_batch = DynamicThroughput.build("A3C", 1, 1000, "static", lookup)
    assert no_batch.batch_size(0) is None
    assert no_batch.steps_per_s("k80", 0) == lookup("A3C", 1)["k80"] > 0
    with pytest.raises(ValueError, match="no row"):
        DynamicThroughput.build("LM (batch size 3)", 1, 1000, "gns", lookup)


def test_posterior_moves_from_the_even_prior_towards_what_it_saw():
    posterior = BatchSizePosterior(regimes=(32, 64), epochs=10)
    assert posterior.remaining_shares() == {32: 0.5, 64: 0.5}
    for epoch in range(4):
        posterior.observe(epoch + 0.5, 32)
    # concentrations 5 + 4 = 9 and 5; expected epochs 10*9/14 - 4 = 2.43 and 10*5/14 = 3.57
    assert posterior.concentrations() == {32: 9.0, 64: 5.0}
    shares = posterior.remaining_shares()
    assert shares[32] == pytest.approx((90 / 14 - 4) / 6)
    assert shares[64] == pytest.approx((50 / 14) / 6)
    # 600 steps left at 1 step/s (32) and 2 steps/s (64)
    assert posterior.remaining_time(600, {32: 1.0, 64: 2.0}) == pytest.approx(
        600 * (shares[32] / 1.0 + shares[64] / 2.0)
    )


def test_posterior_fills_epochs_a_round_skipped_and_counts_each_epoch_once():
    posterior = BatchSizePosterior(regimes=(16,), epochs=20)
    posterior.observe(0.2, 16)
    posterior.observe(3.7, 32)  # epochs 1..3 ran at 32 since the last look
    posterior.observe(3.9, 32)
    assert posterior.seen == {0: 16, 1: 32, 2: 32, 3: 32}
    assert posterior.regimes == (16, 32)
    assert posterior.concentrations() == {16: 11.0, 32: 13.0}


def test_posterior_of_a_finished_job_predicts_no_time_and_of_a_stuck_one_infinity():
    posterior = BatchSizePosterior(regimes=(8,), epochs=3)
    assert posterior.remaining_time(0, {8: 1.0}) == 0.0
    assert posterior.remaining_time(10, {8: 0.0}) == float("inf")
