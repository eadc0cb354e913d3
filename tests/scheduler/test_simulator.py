"""The simulator on small literal traces, with hand-checked answers."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler import FleetSnapshot, PlacementRequest, Queue, QueueReason
from kernelfleet.scheduler.decisions import AdmitDecision
from kernelfleet.scheduler.policies import FcfsBatchPolicy, NotebookOSPolicy, ReservationPolicy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.metrics import percentile

from .json_fields import DOCUMENTED_FIELDS
from .traces import trace

# no kernel lead time, no linger, a fixed fleet: 3 hosts x 8 GPUs, never scaled
FIXED = SimulationConfig(hosts=3, max_hosts=3, session_lead_s=0, session_linger_s=0)
ONE_SESSION = trace((4, 0, 10), (4, 20, 10))  # two cells, 10 min each, 10 min apart


def test_reservation_holds_gpus_for_the_whole_session() -> None:
    result = simulate(ONE_SESSION, [ReservationPolicy(FIXED.autoscaling())], FIXED)["reservation"]
    assert result.end_s == 1800
    assert result.gpu_hours_committed == pytest.approx(4 * 0.5)  # 4 GPUs for 30 min
    assert result.gpu_hours_provisioned == pytest.approx(24 * 0.5)
    assert result.gpu_hours_busy == pytest.approx(4 * 20 / 60)
    assert result.delays_s == [0.0, 0.0]
    assert (result.events, result.sessions, result.migrations) == (2, 1, 0)


def test_notebookos_commits_only_while_cells_run() -> None:
    result = simulate(ONE_SESSION, [NotebookOSPolicy(FIXED.autoscaling())], FIXED)["notebookos"]
    assert result.gpu_hours_committed == pytest.approx(4 * 20 / 60)
    assert result.delays_s == [0.0, 0.0]


def test_fcfs_batch_pays_container_and_state_on_the_critical_path() -> None:
    # each cell: 5 s container + 10 s load, 600 s run, 10 s save = 625 s holding 4 GPUs;
    # cell 2 is submitted 600 s (the trace's gap) after cell 1 ends at 625: 1225 .. 1850
    result = simulate(ONE_SESSION, [FcfsBatchPolicy(FIXED.autoscaling())], FIXED)["fcfs-batch"]
    assert result.delays_s == [15.0, 15.0]
    assert result.end_s == 1850
    assert result.gpu_hours_committed == pytest.approx(4 * 1250 / 3600)
    assert result.gpu_hours_provisioned == pytest.approx(24 * 1850 / 3600)


def test_a_cell_waits_for_gpus_in_a_full_fixed_fleet() -> None:
    # 3 hosts x 1 GPU; sessions A, B, C take the three GPUs; D (minute 3) waits until A ends
    # at minute 10: a 420 s delay, then runs 5 min.
    config = SimulationConfig(
        hosts=3, gpus_per_host=1, max_hosts=3, session_lead_s=0, session_linger_s=0
    )
    fleet_trace = trace((1, 0, 10), (1, 1, 10), (1, 2, 10), (1, 3, 5))
    assert len(fleet_trace.sessions) == 4
    result = simulate(fleet_trace, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
    assert sorted(result.delays_s) == [0.0, 0.0, 0.0, 420.0]
    assert result.end_s == 900
    assert result.scale_outs == 0
    assert result.gpu_hours_committed == pytest.approx(35 / 60)


def test_a_waiting_cell_keeps_the_gpus_it_could_use_from_younger_cells() -> None:
    # 3 hosts x 2 GPUs, every kernel on all three. A (2 GPUs) runs on h1, B (2) on h2, C (1)
    # on h3, from minute 0. D (2 GPUs, minute 1) fits nowhere and waits. E (1 GPU, minute 2)
    # fits h3's free GPU, but D could run on h3, so as in the gateway E waits behind D: D
    # starts when C ends (minute 5, 240 s late), E when A and B end (minute 10, 480 s late).
    # Letting E go first would have made D wait until E ended (minute 6, 300 s late).
    # A lead of 2 min admits every kernel while no GPU is busy (subscription ratio 7).
    config = SimulationConfig(
        hosts=3, gpus_per_host=2, max_hosts=3, session_lead_s=120, session_linger_s=0
    )
    workload = trace((2, 0, 10), (2, 0, 10), (1, 0, 5), (2, 1, 5), (1, 2, 4))
    result = simulate(workload, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
    assert result.delays_s == [0.0, 0.0, 0.0, 240.0, 480.0]
    assert result.end_s == 840  # E ends at minute 10 + 4


def test_a_waiting_cell_without_replicas_keeps_every_host_from_younger_cells() -> None:
    # fcfs-batch: no replicas, a cell runs on any host, 15 s before it (container, state load)
    # and 10 s after (state save). 2 hosts x 2 GPUs: A (2 GPUs) on h1 and B (1) on h2 from 15 s;
    # C (2 GPUs, 60 s) fits nowhere and waits; D (1 GPU, 120 s) fits h2's free GPU, but C could
    # run on any host, so D waits behind it. B ends at 325 s: C starts on h2 at 340 (280 s
    # late); A ends at 625 s: D starts on h1 at 640 (520 s late). Had D gone first (at 135 s,
    # until 385), C would have started at 400.
    config = SimulationConfig(
        hosts=2, gpus_per_host=2, max_hosts=2, session_lead_s=0, session_linger_s=0
    )
    workload = trace((2, 0, 10), (1, 0, 5), (2, 1, 5), (1, 2, 4))
    result = simulate(workload, [FcfsBatchPolicy(config.autoscaling())], config)["fcfs-batch"]
    assert result.delays_s == [15.0, 15.0, 280.0, 520.0]


class AdmitsK1WhenIdle(NotebookOSPolicy):
    """notebookos, except that kernel k1 waits for admission while any GPU is committed."""

    def admit(self, snapshot: FleetSnapshot, request: PlacementRequest) -> AdmitDecision:
        if request.kernel_id == "k1" and snapshot.gpus_committed > 0:
            return Queue(QueueReason.WAITING_FOR_HOSTS, "k1 waits for an idle fleet")
        return super().admit(snapshot, request)


def test_a_kernel_waiting_for_admission_keeps_no_host_from_cells() -> None:
    # 3 hosts x 2 GPUs. A (1 GPU, minute 0-10) runs. B's kernel (k1, minute 0.5) waits for
    # admission until A ends. C (1 GPU, minute 1) finds free GPUs: B is not a waiting cell, so C
    # runs at once. B's cell runs when A ends, 570 s after its submit time.
    config = SimulationConfig(
        hosts=3, gpus_per_host=2, max_hosts=3, session_lead_s=0, session_linger_s=0
    )
    workload = trace((1, 0, 10), (2, 0.5, 1), (1, 1, 1))
    assert len(workload.sessions) == 3
    result = simulate(workload, [AdmitsK1WhenIdle(config.autoscaling())], config)["notebookos"]
    assert result.delays_s == [0.0, 0.0, 570.0]


def test_scale_out_delay_is_on_the_waiting_cells_path() -> None:
    # 1 host x 8 GPUs that may grow to 2: two 8-GPU sessions at minute 0. The second cell
    # finds no GPU and no other host: a scale-out, ready 60 s later, then it runs.
    config = SimulationConfig(hosts=1, max_hosts=2, session_lead_s=0, session_linger_s=0)
    result = simulate(
        trace((8, 0, 10), (8, 0, 10)), [FcfsBatchPolicy(config.autoscaling())], config
    )["fcfs-batch"]
    assert sorted(result.delays_s) == [15.0, 75.0]
    assert result.scale_outs == 1


def test_the_autoscaler_scales_in_idle_hosts_two_per_round() -> None:
    # 1 host minimum, 8 GPUs; a 16-GPU demand grows the fleet, then it shrinks back to 1
    config = SimulationConfig(hosts=1, session_lead_s=0, session_linger_s=0)
    result = simulate(
        trace((8, 0, 30), (8, 0, 30)), [FcfsBatchPolicy(config.autoscaling())], config
    )["fcfs-batch"]
    assert result.scale_outs >= 1
    assert result.scale_ins >= 1
    assert result.rejected_events == 0


def test_cells_larger_than_a_host_are_counted_as_rejected() -> None:
    config = SimulationConfig(hosts=3, gpus_per_host=4, session_lead_s=0, session_linger_s=0)
    policies = [NotebookOSPolicy(), ReservationPolicy(), FcfsBatchPolicy()]
    results = simulate(trace((8, 0, 10), (1, 0, 10)), policies, config)
    for result in results.values():
        assert result.rejected_events == 1
        assert result.events == 1


def test_json_has_exactly_the_documented_fields() -> None:
    result = simulate(ONE_SESSION, [NotebookOSPolicy()], FIXED)["notebookos"]
    assert set(result.as_json()) == set(DOCUMENTED_FIELDS)
    assert set(result.as_json()["start_delay_s"]) == {"p50", "p95", "p99"}


def test_percentile_interpolates() -> None:
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 100) == 5.0
    assert percentile([], 99) == 0.0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="scale_out_delay_s must be >= 0"):
        SimulationConfig(scale_out_delay_s=-1)
    with pytest.raises(InvalidRequest, match="max_hosts 2 is below hosts 3"):
        SimulationConfig(max_hosts=2)


@pytest.mark.parametrize(("timeout", "committed_min"), [(1800, 40 + 10), (0, 110)])
def test_idle_timeout_reclaims_a_reservation_between_cells(timeout: float, committed_min: float):
    # cells at 0-10 and 100-110 min: with a 30 min timeout the kernel is reclaimed at 40 and
    # re-created at 100 (no lead); without one it holds its 4 GPUs from 0 to 110
    config = SimulationConfig(
        hosts=3, max_hosts=3, session_lead_s=0, session_linger_s=0, idle_timeout_s=timeout
    )
    result = simulate(
        trace((4, 0, 10), (4, 100, 10)), [ReservationPolicy(config.autoscaling())], config
    )["reservation"]
    assert result.gpu_hours_committed == pytest.approx(4 * committed_min / 60)
    assert result.delays_s == [0.0, 0.0]
    assert result.end_s == 110 * 60


def test_a_reclaimed_notebookos_kernel_is_placed_again() -> None:
    config = SimulationConfig(hosts=3, max_hosts=3, session_lead_s=60, session_linger_s=0)
    result = simulate(trace((4, 0, 10), (4, 100, 10)), [NotebookOSPolicy()], config)
    assert result["notebookos"].delays_s == [0.0, 0.0]
    assert result["notebookos"].gpu_hours_committed == pytest.approx(4 * 20 / 60)


def test_runs_are_deterministic_and_leave_the_ledger_empty() -> None:
    busy = trace(*((g, m, 7) for m in range(0, 120, 3) for g in (1, 4, 8)))
    config = SimulationConfig(hosts=1, session_lead_s=30, session_linger_s=60, idle_timeout_s=0)
    first = simulate(busy, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
    second = simulate(busy, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
    assert first.as_json() == second.as_json()
    assert first.events + first.rejected_events == len(busy.events)
    assert first.busy_history[-1][1] == 0
