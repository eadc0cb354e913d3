"""Spot hosts in the simulator: dollars by hand, seeded revocations that cost replicas and
never kernels under the majority rule, and a looser rule that loses kernels
(docs/economics.md, "Transient hosts")."""

from __future__ import annotations

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.packing import PackingPolicy
from kernelfleet.scheduler.policies import FcfsBatchPolicy, NotebookOSPolicy, ReservationPolicy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate

from .json_fields import HOST_KIND_FIELDS, POLICY_FIELDS
from .test_simulator import FIXED, ONE_SESSION
from .test_simulator_floor import BARE, ONE_HOUR
from .traces import trace


def test_an_on_demand_fleet_costs_its_gpu_hours_at_the_on_demand_price() -> None:
    result = simulate(ONE_SESSION, [ReservationPolicy(FIXED.autoscaling())], FIXED)["reservation"]
    assert result.gpu_hours_provisioned == pytest.approx(12.0)  # 3 hosts x 8 GPUs, 30 min
    assert result.gpu_hours_spot == 0.0
    assert result.dollars == pytest.approx(12.0 * 2.48)
    assert result.dollars_on_demand == result.dollars
    assert (result.revocations, result.replacements, result.kernels_lost) == (0, 0, 0)


def test_a_spot_host_is_billed_at_the_spot_price_and_starts_later() -> None:
    # fcfs-batch's cell at 0 s finds no host: the one added is spot (share 1), ready after the
    # scale-out delay and CM-DARE's 16 s more; no revocation (rate 0)
    config = SimulationConfig(
        **{**BARE.assumptions, "spot_share": 1.0, "revocation_rate_per_hour": 0.0}
    )
    result = simulate(ONE_HOUR, [FcfsBatchPolicy(config.autoscaling())], config)["fcfs-batch"]
    assert result.delays_s == [60.0 + 16.0]
    assert result.gpu_hours_spot == pytest.approx(result.gpu_hours_provisioned)
    assert result.dollars == pytest.approx(result.gpu_hours_provisioned * 0.74)
    assert result.dollars_on_demand == pytest.approx(result.gpu_hours_provisioned * 2.48)


def test_a_single_replica_policy_never_adds_spot_hosts() -> None:
    config = SimulationConfig(**{**BARE.assumptions, "spot_share": 1.0})
    result = simulate(ONE_HOUR, [ReservationPolicy(config.autoscaling())], config)["reservation"]
    assert result.gpu_hours_spot == 0.0
    assert result.delays_s == [0.0]


def test_new_json_fields_come_after_the_old_ones() -> None:
    result = simulate(ONE_SESSION, [ReservationPolicy(FIXED.autoscaling())], FIXED)["reservation"]
    document = result.as_json()
    assert list(document)[: len(POLICY_FIELDS)][0] == "gpu_hours_provisioned"
    assert list(document)[-len(HOST_KIND_FIELDS) :] == list(HOST_KIND_FIELDS)
    assert document["dollars"] == pytest.approx(12.0 * 2.48)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("spot_price", -0.5),
        ("on_demand_price", float("nan")),
        ("revocation_rate_per_hour", 1e9),
        ("spot_share", 2.0),
        ("spot_replicas_max", -2),
        ("revocation_seed", -1),
    ],
)
def test_impossible_host_kind_parameters_are_refused_with_the_field_named(
    field: str, value: float
) -> None:
    with pytest.raises(InvalidRequest, match=field):
        SimulationConfig(**{field: value})  # type: ignore[arg-type]


# 12 sessions of 24 one-GPU cells (10 min every 15 min) on 2-GPU hosts, every host added being
# spot; spot hosts live 30 min on average, and a replica revoked without notice takes 10 min
# to re-create: a kernel whose other replicas are not a live majority meanwhile is lost
CELLS = [(1, s * 3 + c * 15, 10) for s in range(12) for c in range(24)]
BUSY = trace(*sorted(CELLS, key=lambda cell: cell[1]))
HARSH = SimulationConfig(
    hosts=3,
    gpus_per_host=2,
    spot_share=1.0,
    revocation_rate_per_hour=2.0,
    notice_s=0,
    migration_cost_s=600,
    idle_timeout_s=0,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("policy_class", [NotebookOSPolicy, PackingPolicy])
def test_under_the_majority_rule_revocations_cost_replicas_never_kernels(
    seed: int, policy_class: type[NotebookOSPolicy]
) -> None:
    config = SimulationConfig(**{**HARSH.assumptions, "revocation_seed": seed})
    result = simulate(BUSY, [policy_class(config.autoscaling())], config)[policy_class.name]
    assert result.revocations > 5
    assert result.replacements > result.revocations
    assert result.cells_interrupted > 0
    assert result.gpu_hours_redone > 0
    assert result.events == len(BUSY.events), "every cell ran, the cut ones again"
    assert result.kernels_lost == 0


def test_two_replicas_of_three_on_spot_lose_kernels() -> None:
    lost = []
    for seed in (0, 1, 2):
        config = SimulationConfig(
            **{**HARSH.assumptions, "revocation_seed": seed, "spot_replicas_max": 2}
        )
        result = simulate(BUSY, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
        lost.append(result.kernels_lost)
    assert sum(lost) > 0, lost


def test_the_same_seed_gives_the_same_revocations() -> None:
    def run(seed: int) -> tuple[int, int, float]:
        config = SimulationConfig(**{**HARSH.assumptions, "revocation_seed": seed})
        result = simulate(BUSY, [NotebookOSPolicy(config.autoscaling())], config)["notebookos"]
        return result.revocations, result.replacements, result.dollars

    assert run(1) == run(1)
    assert run(1) != run(2)
