"""FleetView: the one snapshot the kernel service and the autoscaler read."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.fleet_view import FleetView
from kernelfleet.gateway.hosts import HostRegistry, HostState
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.scheduler.usage import UsageWindow


@dataclass
class Cells:
    waiting_gpus: int = 0


class Growth:
    """An autoscaler that started auto-1, which has not registered, and adds 4-GPU hosts."""

    def __init__(self) -> None:
        self.asked: list[set[str]] = []

    def pending(self, alive: set[str]) -> int:
        self.asked.append(alive)
        return 0 if "auto-1" in alive else 1

    def addable_host_size(self, hosts: int) -> int:
        return 4 if hosts < 4 else 0


def report(gpus: int) -> dict:
    return {
        "address": "http://127.0.0.1:1",
        "gpus": [{"index": i} for i in range(gpus)],
        "replicas": [],
    }


def test_the_snapshot_joins_hosts_ledger_waiting_demand_and_growth() -> None:
    hosts = HostRegistry("token-123456", heartbeat_timeout=5.0)
    for host_id, gpus in (("h1", 2), ("h2", 2), ("h3", 1)):
        hosts.report(host_id, report(gpus), now=0.0)
    ledger = GpuLedger()
    ledger.set_host("h1", ["0", "1"])
    ledger.subscribe("h1", "k1", "r1", 1)
    cells = Cells(waiting_gpus=3)
    view = FleetView(hosts, ledger, cells, UsageWindow(1))

    snapshot = view.snapshot()
    assert [(h.id, h.gpus_total, h.gpus_subscribed, h.alive) for h in snapshot.hosts] == [
        ("h1", 2, 1, True),
        ("h2", 2, 0, True),  # not in the ledger yet: its reported GPUs
        ("h3", 1, 0, True),
    ]
    assert (snapshot.gpus_waiting, snapshot.hosts_pending, snapshot.gpus_per_host) == (3, 0, 0)

    hosts.get("h2").move_to(HostState.DRAINING)
    hosts.check_liveness(now=1.0)
    hosts.get("h3").last_seen = -10.0
    hosts.check_liveness(now=1.0)  # h3 is lost
    view.admitting("k2", 2)
    growth = Growth()
    view.grow_with(growth)
    snapshot = view.snapshot()
    assert [h.id for h in snapshot.alive_hosts()] == ["h1"], "draining and lost take no work"
    assert growth.asked == [{"h1", "h2"}], "pending hosts are those not heartbeating yet"
    assert (snapshot.gpus_waiting, snapshot.hosts_pending, snapshot.gpus_per_host) == (5, 1, 4)
    view.admitted("k2")
    assert view.snapshot().gpus_waiting == 3

    without = view.snapshot_without({"h1"})
    assert [h.id for h in without.hosts] == ["h2", "h3"]
    assert without.gpus_waiting == 0, "only the hosts are kept"
    hosts.close()


def test_usage_samples_demand_and_busy_gpus_from_the_ledger() -> None:
    hosts = HostRegistry("token-123456", heartbeat_timeout=5.0)
    ledger = GpuLedger()
    ledger.set_host("h1", ["0", "1"])
    ledger.subscribe("h1", "k1", "r1", 2)
    ledger.commit("h1", "k1", "r1", "c1", 1)
    view = FleetView(hosts, ledger, Cells(), UsageWindow(1))
    view.sample_usage()
    snapshot = view.snapshot()
    assert (snapshot.demand_gpus, snapshot.busy_gpus) == (2, 1)


def test_a_container_kernel_sees_only_hosts_that_reach_a_container_engine() -> None:
    hosts = HostRegistry("token-123456", heartbeat_timeout=5.0)
    engine = {"engine": "unix:///run/podman.sock", "reachable": True, "why": None}
    gone = {"engine": "unix:///gone.sock", "reachable": False, "why": "no such socket"}
    hosts.report("plain", report(2), now=0.0)
    hosts.report("engine", {**report(2), "containers": engine}, now=0.0)
    hosts.report("engine-gone", {**report(2), "containers": gone}, now=0.0)
    ledger = GpuLedger()
    ledger.set_host("engine", ["0", "1"])  # in the ledger or not, the same rule
    view = FleetView(hosts, ledger, Cells(), UsageWindow(1), frozenset({"kf-pytorch"}))

    def alive(snapshot) -> list[str]:
        return sorted(host.id for host in snapshot.alive_hosts())

    assert alive(view.snapshot("kf-pytorch")) == ["engine"]
    assert alive(view.snapshot("python3")) == ["engine", "engine-gone", "plain"]
    assert alive(view.snapshot()) == ["engine", "engine-gone", "plain"]
    assert alive(view.snapshot_without({"plain"}, "kf-pytorch")) == ["engine"]
    assert (view.in_containers("kf-pytorch"), view.in_containers("python3")) == (True, False)

    hosts.report("engine-gone", {**report(2), "containers": engine}, now=1.0)  # it is back
    assert alive(view.snapshot("kf-pytorch")) == ["engine", "engine-gone"]
    assert hosts.get("plain").containers is None
    hosts.close()


def test_a_malformed_containers_member_is_refused_naming_it() -> None:
    hosts = HostRegistry("token-123456", heartbeat_timeout=5.0)
    for bad in ({"engine": "unix:///x"}, {"engine": 1, "reachable": True}, "yes", []):
        with pytest.raises(InvalidRequest, match="'containers' must be null or"):
            hosts.report("h1", {**report(2), "containers": bad}, now=0.0)
    hosts.close()
