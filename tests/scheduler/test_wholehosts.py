"""The ``whole-hosts`` policy on literal snapshots and a literal trace, with hand-checked
answers, side by side with ``packing`` where they differ."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler import (
    ExecuteRequest,
    FleetSnapshot,
    HostSnapshot,
    KernelSnapshot,
    Placement,
    Reject,
    RunOn,
    ScaleOut,
)
from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.packing import PackingPolicy
from kernelfleet.scheduler.policy import PlacementRequest, available_policies, load_policy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.simulator.report import resolve_policy
from kernelfleet.scheduler.trace import Trace, TraceEvent, recover_sessions
from kernelfleet.scheduler.wholehosts import WholeHostsPolicy

ROOT = Path(__file__).resolve().parents[2]


def host(
    name: str, com: int = 0, rep: int = 0, sub: int = 0, kind: str = "on-demand"
) -> HostSnapshot:
    return HostSnapshot(name, 8, gpus_subscribed=sub, gpus_committed=com, replicas=rep, kind=kind)


def fleet(*hosts: HostSnapshot, pending: int = 0, grows: bool = True) -> FleetSnapshot:
    return FleetSnapshot(hosts=hosts, gpus_per_host=8 if grows else 0, hosts_pending=pending)


def kernel(gpus: int, replicas: int = 3) -> PlacementRequest:
    return PlacementRequest("k", replicas=replicas, gpus=gpus)


def test_the_first_replica_goes_where_the_first_cell_fits_best() -> None:
    # a and b hold no replica but run others' cells (6 and 8 GPUs committed); c and d, idle,
    # hold one replica each. packing takes the fewest replicas first: a, b, then c: its 4-GPU
    # first cell fits none of a and b, and c only by luck of the order. whole-hosts puts the
    # first replica on the host that can run it now with the fewest idle GPUs left: c and d
    # tie on 8 idle, c by id; then NotebookOS's order for the others.
    snapshot = fleet(host("a", com=6), host("b", com=8), host("c", rep=1), host("d", rep=1))
    assert PackingPolicy().admit(snapshot, kernel(4)) == Placement(("a", "b", "c"))
    assert WholeHostsPolicy().admit(snapshot, kernel(4)) == Placement(("c", "a", "b"))
    # a 2-GPU kernel fits a (2 idle) most tightly: whole hosts c and d stay whole
    assert WholeHostsPolicy().admit(snapshot, kernel(2)) == Placement(("a", "b", "c"))


def test_no_host_with_the_gpus_asks_for_one_and_the_kernel_waits() -> None:
    snapshot = fleet(host("a", com=8), host("b", com=6), host("c", com=7))
    assert WholeHostsPolicy().admit(snapshot, kernel(4)) == ScaleOut(1)
    # a host is already being added: placed as packing places it (its cell may migrate)
    pending = fleet(host("a", com=8), host("b", com=6), host("c", com=7), pending=1)
    expected = PackingPolicy().admit(pending, kernel(4))
    assert WholeHostsPolicy().admit(pending, kernel(4)) == expected == Placement(("b", "c", "a"))
    # a fixed fleet: no host will come, so the kernel is placed as packing places it
    fixed = fleet(host("a", com=8), host("b", com=6), host("c", com=7), grows=False)
    assert WholeHostsPolicy().admit(fixed, kernel(4)) == Placement(("b", "c", "a"))


def test_kernels_without_gpus_and_too_large_ones_are_packings() -> None:
    snapshot = fleet(host("a", com=8), host("b"), host("c"))
    assert WholeHostsPolicy().admit(snapshot, kernel(0)) == PackingPolicy().admit(
        snapshot, kernel(0)
    )
    decision = WholeHostsPolicy().admit(snapshot, kernel(9))
    assert isinstance(decision, Reject)
    assert "needs 9 GPU(s) on one host; the largest has 8" in decision.detail


def test_the_subscription_ratio_and_the_spot_rule_still_bind() -> None:
    # c can run the cell now, but a replica there would take it past the cluster ratio
    # (its 8 idle GPUs are subscribed 7 times): the next host that can run it now, d
    ratio_bound = FleetSnapshot(
        hosts=(host("a", com=8), host("b", com=8), host("c", sub=56), host("d", sub=8)),
        gpus_per_host=8,
        demand_gpus=16,
        busy_gpus=8,
    )
    assert WholeHostsPolicy().admit(ratio_bound, kernel(8)) == Placement(("d", "a", "b"))
    # the only host that can run it now is spot, and a 1-replica kernel may not be on spot:
    # placing it there is not allowed, so a host more
    spot = fleet(host("a", com=8), host("s", kind="spot"))
    assert WholeHostsPolicy().admit(spot, kernel(4, replicas=1)) == ScaleOut(1)
    # with 3 replicas one may be on spot: the first, with two on-demand ones
    spot3 = fleet(host("a", com=8), host("b", com=8), host("s", kind="spot"))
    assert WholeHostsPolicy().admit(spot3, kernel(4)) == Placement(("s", "a", "b"))


def test_a_cell_stays_on_its_previous_executor_when_it_fits() -> None:
    # a has 2 idle GPUs, b (the previous executor) 8: packing moves the 1-GPU cell to a, the
    # tighter fit; whole-hosts keeps it on b. Without a previous executor that fits: best fit.
    snapshot = fleet(host("a", com=6), host("b"), host("c", com=8))
    request = ExecuteRequest(KernelSnapshot("k", 1, ("a", "b", "c"), "b"), 1)
    assert PackingPolicy().choose_executor(snapshot, request) == RunOn("a")
    assert WholeHostsPolicy().choose_executor(snapshot, request) == RunOn("b")
    on_full = ExecuteRequest(KernelSnapshot("k", 1, ("a", "b", "c"), "c"), 1)
    assert WholeHostsPolicy().choose_executor(snapshot, on_full) == RunOn("a")


def test_known_by_name_and_declared_as_an_entry_point() -> None:
    # the simulator's and the gateway's lookups find it whether or not the installed entry
    # points predate it (a checkout run with PYTHONPATH), with the autoscaler config given
    config = AutoscaleConfig(buffer_hosts=0)
    for policy in (resolve_policy("whole-hosts", config), load_policy("whole-hosts", config)):
        assert isinstance(policy, WholeHostsPolicy)
        assert policy.autoscaling == config
    assert "whole-hosts" in available_policies()
    with pytest.raises(InvalidRequest, match="unknown policy 'whole-host'; installed policies: "):
        load_policy("whole-host")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["kernelfleet.policies"]["whole-hosts"] == (
        "kernelfleet.scheduler.wholehosts:WholeHostsPolicy"
    )


def trace(*events: tuple[int, float, float]) -> Trace:
    parsed = tuple(
        TraceEvent(line=i + 2, job_id=str(i), gpus=g, submit_min=s, duration_min=d)
        for i, (g, s, d) in enumerate(events)
    )
    return Trace("literal", parsed, recover_sessions(parsed))


def test_the_host_a_new_kernel_needs_boots_while_the_kernel_starts() -> None:
    # 3 hosts of 8 GPUs, room for a 4th, no buffer host and no headroom. Three 8-GPU cells fill
    # the 3 hosts for 30 min from minute 0; a fourth 8-GPU session's kernel starts at minute 1
    # (60 s before its cell at minute 2). packing places it on the 3 full hosts: at minute 2 its
    # cell asks for a host (60 s), then migrates a replica there (10 s): 70 s late.
    # whole-hosts asks for the host when the kernel starts: it is up at minute 2, the kernel
    # has its first replica there, and the cell starts at once.
    config = SimulationConfig(
        hosts=3,
        max_hosts=4,
        autoscale_headroom=1.0,
        autoscale_buffer_hosts=0,
        session_lead_s=60,
        session_linger_s=0,
        idle_timeout_s=0,
    )
    workload = trace((8, 0, 30), (8, 0, 30), (8, 0, 30), (8, 2, 10))
    policies = [PackingPolicy(config.autoscaling()), WholeHostsPolicy(config.autoscaling())]
    results = simulate(workload, policies, config)
    assert results["packing"].delays_s == [0.0, 0.0, 0.0, 70.0]
    assert results["whole-hosts"].delays_s == [0.0, 0.0, 0.0, 0.0]
    assert results["packing"].migrations_for_cells == 1
    assert results["whole-hosts"].migrations_for_cells == 0
    assert results["packing"].scale_outs == results["whole-hosts"].scale_outs == 1


@pytest.mark.parametrize("policy", ["packing", "whole-hosts"])
def test_every_cell_runs_and_the_ledger_balances(policy: str) -> None:
    # a mixed small workload with re-used kernels (two cells a session) and idle reclamation;
    # the simulator raises LedgerError if GPUs or kernels were left over
    config = SimulationConfig(hosts=3, autoscale_buffer_hosts=0, idle_timeout_s=300)
    events = [(g, 3 * i, 4 + i % 5) for i, g in enumerate((1, 4, 8, 8, 1, 4, 8, 1, 8, 4))]
    result = simulate(trace(*events), [resolve_policy(policy, config.autoscaling())], config)
    assert result[policy].events == len(events)
    assert result[policy].rejected_events == 0
