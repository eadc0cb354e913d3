"""The ``packing`` policy on literal snapshots and a literal trace, with hand-checked answers,
side by side with ``notebookos`` where they differ."""

from __future__ import annotations

import pytest

from kernelfleet.scheduler import (
    ExecuteRequest,
    FleetSnapshot,
    HostSnapshot,
    KernelSnapshot,
    Migrate,
    Queue,
    RunOn,
    ScaleIn,
    ScaleOut,
    load_policy,
)
from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.packing import PackingPolicy, best_fit_target
from kernelfleet.scheduler.policies import NotebookOSPolicy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate

from .traces import trace


def host(name: str, com: int = 0, rep: int = 0, total: int = 8) -> HostSnapshot:
    return HostSnapshot(name, total, gpus_committed=com, replicas=rep)


def fleet(*hosts: HostSnapshot, pending: int = 0) -> FleetSnapshot:
    return FleetSnapshot(hosts=hosts, gpus_per_host=8, hosts_pending=pending)


def cell(gpus: int, replicas: tuple[str, ...], executor: str | None = None) -> ExecuteRequest:
    return ExecuteRequest(KernelSnapshot("k", gpus, replicas, executor), gpus)


def test_a_cell_runs_where_it_fits_most_tightly() -> None:
    # a has 2 idle GPUs, b 8; the previous executor b is warm, but a 1-GPU cell fits a better
    snapshot = fleet(host("a", com=6), host("b"), host("c"))
    assert PackingPolicy().choose_executor(snapshot, cell(1, ("a", "b"), "b")) == RunOn("a")
    assert NotebookOSPolicy().choose_executor(snapshot, cell(1, ("a", "b"), "b")) == RunOn("b")
    # 4 GPUs do not fit a: b
    assert PackingPolicy().choose_executor(snapshot, cell(4, ("a", "b"), "a")) == RunOn("b")


def test_ties_go_to_the_previous_executor() -> None:
    snapshot = fleet(host("a", com=4), host("b", com=4))
    assert PackingPolicy().choose_executor(snapshot, cell(2, ("a", "b"), "b")) == RunOn("b")
    assert PackingPolicy().choose_executor(snapshot, cell(2, ("a", "b"))) == RunOn("a")


def test_migration_goes_to_the_tightest_fitting_host() -> None:
    # replicas a and b are full; c has 8 idle GPUs, d 4: a 4-GPU cell moves to d (notebookos: c)
    snapshot = fleet(host("a", com=8), host("b", com=7), host("c"), host("d", com=4))
    request = cell(4, ("a", "b"), "a")
    assert PackingPolicy().choose_executor(snapshot, request) == Migrate("a", "d")
    assert NotebookOSPolicy().choose_executor(snapshot, request) == Migrate("a", "c")
    assert best_fit_target(snapshot, 8, exclude=("a", "b")) == snapshot.host("c")
    assert best_fit_target(snapshot, 8, exclude=("a", "b", "c")) is None


def test_no_room_anywhere_scales_out_or_waits() -> None:
    full = (host("a", com=8), host("b", com=8))
    assert PackingPolicy().choose_executor(fleet(*full), cell(1, ("a",))) == ScaleOut(1)
    decision = PackingPolicy().choose_executor(fleet(*full, pending=1), cell(1, ("a",)))
    assert isinstance(decision, Queue)


@pytest.mark.parametrize(("buffer_hosts", "released"), [(1, ("c",)), (0, ("c", "d"))])
def test_the_autoscaler_is_notebookos_with_the_config_given(buffer_hosts, released) -> None:
    # 12 committed GPUs * 1.05 / 8 -> 2 hosts + the buffer; 4 alive, 2 idle. No hidden
    # override: packing and notebookos release the same hosts under the same config.
    config = AutoscaleConfig(min_hosts=1, buffer_hosts=buffer_hosts)
    snapshot = fleet(host("a", com=8), host("b", com=4), host("c"), host("d", rep=2))
    assert PackingPolicy(config).autoscale(snapshot) == ScaleIn(released)
    assert NotebookOSPolicy(config).autoscale(snapshot) == ScaleIn(released)
    assert PackingPolicy(config).autoscaling == config


def test_registered_as_an_entry_point() -> None:
    assert isinstance(load_policy("packing"), PackingPolicy)


def test_packing_leaves_a_whole_host_for_an_8_gpu_cell() -> None:
    # 3 hosts x 8 GPUs, room for a 4th. Three 1-GPU sessions start at minutes 0, 1, 2 (30 min
    # cells); an 8-GPU session at minute 3. Every kernel has a replica on each of h1..h3.
    # notebookos spreads the 1-GPU cells over h1, h2, h3: the 8-GPU cell fits nowhere, so a
    # scale-out (60 s) and a migration to the new host (10 s): 70 s late.
    # packing puts all three on h1: the 8-GPU cell starts on h2 at once.
    config = SimulationConfig(
        hosts=3, max_hosts=4, session_lead_s=0, session_linger_s=0, idle_timeout_s=0
    )
    workload = trace((1, 0, 30), (1, 1, 30), (1, 2, 30), (8, 3, 10))
    policies = [NotebookOSPolicy(config.autoscaling()), PackingPolicy(config.autoscaling())]
    results = simulate(workload, policies, config)
    assert results["notebookos"].delays_s == [0.0, 0.0, 0.0, 70.0]
    assert results["packing"].delays_s == [0.0, 0.0, 0.0, 0.0]
    assert results["notebookos"].scale_outs == 1
    assert results["packing"].scale_outs == 0
    # 3 GPUs for 30 min and 8 for 10 min; notebookos also holds the 8 through the migration
    assert results["packing"].gpu_hours_committed == pytest.approx(1.5 + 8 / 6)
    assert results["notebookos"].gpu_hours_committed == pytest.approx(1.5 + 8 / 6 + 8 * 10 / 3600)
    assert results["packing"].gpu_hours_provisioned < results["notebookos"].gpu_hours_provisioned
