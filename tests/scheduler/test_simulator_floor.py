"""The GPU-hour floor, the saving share and the steady autoscaler in the simulator, on small
literal traces with answers worked out by hand."""

from __future__ import annotations

import pytest

from kernelfleet.scheduler.policies import FcfsBatchPolicy, ReservationPolicy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.floor import busy_floor_gpu_hours, saving_share
from kernelfleet.scheduler.simulator.report import floor_text, results_table

from .json_fields import DOCUMENTED_FIELDS, POLICY_FIELDS
from .traces import trace

# hosts of 1 GPU, none at the start nor kept, no headroom nor buffer, no fcfs-batch overheads:
# every figure below is whole seconds of one host
BARE = SimulationConfig(
    hosts=0,
    gpus_per_host=1,
    autoscale_headroom=1.0,
    autoscale_buffer_hosts=0,
    container_start_s=0,
    state_load_s=0,
    state_save_s=0,
)
ONE_HOUR = trace((1, 0, 60))  # one 1-GPU cell of 60 min at minute 0


def test_floor_and_share_by_hand() -> None:
    # reservation: admitted 60 s before the cell (lead) with no host: scale-out, ready at 0 s;
    # the host lives until the session ends at 3600 + 1800 s linger: 1.5 GPU-hours.
    # fcfs-batch: the cell at 0 s finds no host: scale-out, runs 60..3660 s, and the next
    # round (3660 s) releases the host: 1.0 GPU-hour, the floor, so the whole saving.
    policies = [FcfsBatchPolicy(BARE.autoscaling()), ReservationPolicy(BARE.autoscaling())]
    results = simulate(ONE_HOUR, policies, BARE)
    fcfs, reservation = results["fcfs-batch"], results["reservation"]
    assert busy_floor_gpu_hours(ONE_HOUR, 1) == pytest.approx(1.0)
    assert reservation.gpu_hours_provisioned == pytest.approx(1.5)
    assert fcfs.gpu_hours_provisioned == pytest.approx(1.0)
    assert fcfs.delays_s == [60.0]
    assert (fcfs.gpu_hours_floor, fcfs.gpu_hours_reservation) == (pytest.approx(1.0), 1.5)
    assert fcfs.saving_share == pytest.approx(1.0)
    assert reservation.saving_share == pytest.approx(0.0)
    assert fcfs.reservation_source == "the reservation run"


def test_old_json_fields_keep_their_names_order_and_values() -> None:
    fcfs = simulate(ONE_HOUR, [FcfsBatchPolicy(BARE.autoscaling())], BARE)["fcfs-batch"]
    document = fcfs.as_json()
    assert set(document) == set(DOCUMENTED_FIELDS)
    assert list(document)[: len(POLICY_FIELDS)] == list(POLICY_FIELDS)
    assert {name: document[name] for name in POLICY_FIELDS} == {
        "gpu_hours_provisioned": 1.0,
        "gpu_hours_committed": 1.0,
        "start_delay_s": {"p50": 60.0, "p95": 60.0, "p99": 60.0},
        "migrations": 0,
        "scale_outs": 1,
        "scale_ins": 1,
        "events": 1,
    }
    # no reservation run and none asked for: the share is unknown, and says so
    assert document["gpu_hours_busy"] == 1.0
    assert document["gpu_hours_floor"] == 1.0
    assert document["gpu_hours_reservation"] is None
    assert document["saving_share"] is None


def test_a_reference_reservation_run_gives_the_share_when_reservation_is_not_listed() -> None:
    results = simulate(ONE_HOUR, [FcfsBatchPolicy(BARE.autoscaling())], BARE, reference=True)
    assert list(results) == ["fcfs-batch"]
    fcfs = results["fcfs-batch"]
    assert fcfs.gpu_hours_reservation == pytest.approx(1.5)
    assert fcfs.as_json()["saving_share"] == 1.0
    assert "added as the reference" in fcfs.reservation_source
    assert "against 2 from a reservation run added as the reference" in floor_text(results)
    assert "saving %" in results_table(results)


def test_saving_share_is_undefined_without_a_saving_to_make() -> None:
    assert saving_share(150.0, 200.0, 100.0) == 0.5
    assert saving_share(90.0, 100.0, 100.0) is None


def test_the_floor_leaves_out_cells_larger_than_a_host() -> None:
    assert busy_floor_gpu_hours(trace((1, 0, 60), (8, 0, 30)), 4) == pytest.approx(1.0)


# A host of 8 GPUs always busy with a long session, and a second session whose 8-GPU cells of
# 2 min come every 5 min: each cell needs a second host.
FLAPPING = trace((8, 0, 60), (8, 1, 2), (8, 6, 2), (8, 11, 2), (8, 16, 2), (8, 21, 2))
EIGHT = SimulationConfig(
    hosts=1, autoscale_headroom=1.0, autoscale_buffer_hosts=0, session_lead_s=0
)


@pytest.mark.parametrize(
    "steady", [{"scale_in_idle_s": 600.0}, {"min_host_lifetime_s": 1800.0}], ids=str
)
def test_hysteresis_or_a_minimum_lifetime_stops_the_flapping(steady: dict[str, float]) -> None:
    # by default every short cell adds the second host and the next round releases it: five
    # scale-outs, each cell waiting 60 s for its host (+ 15 s of fcfs-batch's own overhead);
    # kept for 10 min idle, or 30 min in all, the host is added once and reused
    flapping = simulate(FLAPPING, [FcfsBatchPolicy(EIGHT.autoscaling())], EIGHT)["fcfs-batch"]
    assert (flapping.scale_outs, flapping.scale_ins) == (5, 5)
    config = SimulationConfig(**{**EIGHT.assumptions, **steady})
    result = simulate(FLAPPING, [FcfsBatchPolicy(config.autoscaling())], config)["fcfs-batch"]
    assert result.scale_outs == 1
    assert sorted(result.delays_s) == [15.0, 15.0, 15.0, 15.0, 15.0, 75.0]
    assert sorted(flapping.delays_s) == [15.0] + [75.0] * 5


def test_warm_capacity_has_a_host_ready_before_the_first_short_cell() -> None:
    # session A's cell at 0 s is an arrival of 8 GPUs; over a 600 s lead at the median that
    # wants 8 * 600 / 900 = 5.3 -> 6 warm GPUs, so the round at 0 s adds a host, ready at 60 s
    # when B's first cell comes: with the hysteresis above, no cell meets a scale-out
    config = SimulationConfig(
        **{
            **EIGHT.assumptions,
            "warm_quantile": 0.5,
            "warm_lead_s": 600.0,
            "scale_in_idle_s": 600.0,
        }
    )
    result = simulate(FLAPPING, [FcfsBatchPolicy(config.autoscaling())], config)["fcfs-batch"]
    assert result.delays_s == [15.0] * 6
