"""The autoscaler driver on literal fleets, with an in-memory host provider."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kernelfleet.errors import HostLimitReached, NotFound
from kernelfleet.gateway.autoscaler import Autoscaler
from kernelfleet.gateway.host_provider import HostProvider
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.scheduler import AutoscaleConfig, FleetSnapshot, HostSnapshot, ScaleIn, ScaleOut
from kernelfleet.scheduler.hostkinds import ON_DEMAND, SPOT
from kernelfleet.scheduler.policies import NotebookOSPolicy


class FakeProvider(HostProvider):
    """Hosts appear in `FakeFleet` only when the test says they registered."""

    def __init__(self, max_hosts: int = 0, gpus_per_host: int = 2) -> None:
        self.max_hosts = max_hosts
        self.gpus_per_host = gpus_per_host
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.kinds: list[str | None] = []

    async def start_host(self, kind: str | None = None) -> str:
        if self.max_hosts and len(self.hosts()) >= self.max_hosts:
            raise HostLimitReached("fake provider full")
        host_id = f"auto-{len(self.started) + 1}"
        self.started.append(host_id)
        self.kinds.append(kind)
        return host_id

    async def stop_host(self, host_id: str) -> None:
        if host_id not in self.hosts():
            raise NotFound(host_id)
        self.stopped.append(host_id)

    def hosts(self) -> tuple[str, ...]:
        return tuple(h for h in self.started if h not in self.stopped)

    def pending(self) -> tuple[str, ...]:
        return ()


@dataclass
class FakeFleet:
    """Hosts as (committed GPUs, replicas), 2 GPUs each; the GPUs cells wait for."""

    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)
    waiting: int = 0

    def snapshot(self) -> FleetSnapshot:
        return FleetSnapshot(
            hosts=tuple(
                HostSnapshot(h, 2, gpus_committed=c, replicas=r) for h, (c, r) in self.hosts.items()
            ),
            gpus_waiting=self.waiting,
        )

    def stopping(self, host_id: str) -> None:
        """The autoscaler closes a drained host; this fleet shows it as it is until forgotten."""

    def forget(self, host_id: str) -> None:
        del self.hosts[host_id]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(**config: int | float) -> NotebookOSPolicy:
    defaults: dict = {"headroom": 1.0, "buffer_hosts": 0, "min_hosts": 1}
    return NotebookOSPolicy(AutoscaleConfig(**{**defaults, **config}))


def autoscaler(fleet: FakeFleet, provider: FakeProvider, **kwargs) -> Autoscaler:
    drained: list[str] = kwargs.pop("drained", [])

    async def drain(host_id: str) -> None:
        drained.append(host_id)

    kwargs.setdefault("cooldown", 0.0)
    kwargs.setdefault("hosts", fleet)
    return Autoscaler(
        fleet.snapshot,
        kwargs.pop("policy", policy()),
        provider,
        kwargs.pop("drain", drain),
        **kwargs,
    )


async def test_sustained_demand_adds_hosts_once_and_counts_them() -> None:
    fleet = FakeFleet({"h1": (2, 1)}, waiting=4)  # 6 GPUs wanted, 2 per host -> 3 hosts
    provider = FakeProvider()
    metrics = FleetMetrics()
    scaler = autoscaler(fleet, provider, metrics=metrics)
    first = await scaler.run_once()
    assert first.decision == ScaleOut(2)
    assert first.started == ("auto-1", "auto-2")
    assert metrics.registry.get_sample_value("kernelfleet_scale_out_hosts_total") == 2
    # not registered yet: pending, so the next round does not add them again
    assert scaler.snapshot().hosts_pending == 2
    assert (await scaler.run_once()).started == ()
    fleet.hosts.update({"auto-1": (0, 0), "auto-2": (0, 0)})
    assert scaler.snapshot().hosts_pending == 0
    assert (await scaler.run_once()).started == ()


async def test_max_hosts_and_the_providers_limit_cap_a_scale_out() -> None:
    fleet = FakeFleet({"h1": (2, 0)}, waiting=10)
    scaler = autoscaler(fleet, FakeProvider(), max_hosts=3)
    result = await scaler.run_once()
    assert result.started == ("auto-1", "auto-2")
    assert result.decision == ScaleOut(5)  # 12 GPUs wanted, 2 per host, 1 host
    assert result.skipped == (("scale-out", "3 host(s) over max_hosts"),)

    provider = FakeProvider(max_hosts=1)
    result = await autoscaler(FakeFleet({"h1": (2, 0)}, waiting=4), provider).run_once()
    assert result.started == ("auto-1",)
    assert result.skipped == (("scale-out", "fake provider full"),)


async def test_cooldown_and_patience_hold_decisions_back() -> None:
    clock = Clock()
    fleet = FakeFleet({"h1": (2, 0)}, waiting=2)
    provider = FakeProvider()
    scaler = autoscaler(fleet, provider, clock=clock, cooldown=30.0, patience=2)
    first = await scaler.run_once()
    assert first.decision == ScaleOut(1)
    assert first.skipped == (("round", "decided 1 of 2 rounds in a row"),)
    assert (await scaler.run_once()).started == ("auto-1",)
    fleet.hosts["auto-1"] = (0, 0)

    fleet.waiting = 4  # more demand at once: patience again, then the cooldown
    assert (await scaler.run_once()).skipped[0][1] == "decided 1 of 2 rounds in a row"
    assert (await scaler.run_once()).skipped[0][1].startswith("cooling down until 1030.0")
    clock.now += 30
    assert (await scaler.run_once()).started == ("auto-2",)

    fleet.waiting = 0  # a blip of low demand between two rounds of high demand resets patience
    fleet.hosts["auto-2"] = (0, 0)
    clock.now += 60
    fleet.waiting = 100
    assert (await scaler.run_once()).started == ()
    fleet.waiting = 0
    assert (await scaler.run_once()).stopped == ()


async def test_idle_hosts_are_drained_then_stopped_and_hidden() -> None:
    fleet = FakeFleet({"h1": (0, 2)})
    provider = FakeProvider()
    metrics = FleetMetrics()
    drained: list[str] = []

    async def drain(host_id: str) -> None:
        drained.append(host_id)
        committed, _ = fleet.hosts[host_id]
        fleet.hosts[host_id] = (committed, 0)  # the caller moved its replicas away

    scaler = autoscaler(fleet, provider, drain=drain, metrics=metrics)
    for host_id in ("auto-1", "auto-2"):
        await provider.start_host()
        fleet.hosts[host_id] = (0, 1 if host_id == "auto-1" else 0)
    result = await scaler.run_once()
    assert result.decision == ScaleIn(("auto-2", "auto-1"))  # fewest replicas first
    assert result.stopped == ("auto-2", "auto-1")
    assert drained == ["auto-2", "auto-1"], "even an empty host is drained: closed to new work"
    assert metrics.registry.get_sample_value("kernelfleet_scale_in_hosts_total") == 2
    # the gateway still shows them alive until their heartbeats time out: not counted
    snapshot = scaler.snapshot()
    assert [h.id for h in snapshot.alive_hosts()] == ["h1"]
    assert (await scaler.run_once()).stopped == ()


async def test_scale_in_keeps_min_hosts_and_leaves_what_it_cannot_stop() -> None:
    fleet = FakeFleet({"h1": (0, 0), "h2": (0, 0)})
    provider = FakeProvider()
    for host_id in ("auto-1", "auto-2", "auto-3"):
        await provider.start_host()
        fleet.hosts[host_id] = (0, 1)

    async def stubborn(host_id: str) -> None:
        pass  # moves nothing

    scaler = autoscaler(fleet, provider, drain=stubborn, policy=policy(max_scale_in=5))
    result = await scaler.run_once()
    assert result.stopped == ()
    # the policy chose h1, h2, auto-1, auto-2; h1 was swapped for auto-3, h2 had no spare
    assert result.decision == ScaleIn(("h1", "h2", "auto-1", "auto-2"))
    assert dict(result.skipped) == {
        "h2": "not started by this autoscaler's provider",
        "auto-1": "still holds 1 replica(s) after draining",
        "auto-2": "still holds 1 replica(s) after draining",
        "auto-3": "still holds 1 replica(s) after draining",
    }

    fleet.hosts.update({"auto-1": (0, 0), "auto-2": (0, 0), "auto-3": (0, 0)})
    kept = autoscaler(fleet, provider, policy=policy(max_scale_in=5), min_hosts=3)
    result = await kept.run_once()
    assert result.stopped == ("auto-1", "auto-2")
    assert ("auto-3", "the fleet is at min_hosts (3)") in result.skipped


async def test_a_failed_drain_leaves_the_host_running() -> None:
    from kernelfleet.errors import Conflict

    fleet = FakeFleet({"h1": (0, 0)})
    provider = FakeProvider()
    await provider.start_host()
    fleet.hosts["auto-1"] = (0, 1)

    async def refuse(host_id: str) -> None:
        raise Conflict("no host can take the replica")

    result = await autoscaler(fleet, provider, drain=refuse).run_once()
    assert result.skipped == (("auto-1", "draining failed: no host can take the replica"),)
    assert provider.hosts() == ("auto-1",)


def test_limits_are_checked() -> None:
    fleet, provider = FakeFleet(), FakeProvider()
    with pytest.raises(ValueError, match="exceeds max_hosts"):
        autoscaler(fleet, provider, min_hosts=3, max_hosts=2)
    with pytest.raises(ValueError, match="patience"):
        autoscaler(fleet, provider, patience=0)


async def test_it_tells_policies_the_hosts_on_their_way_and_whether_more_can_come() -> None:
    fleet = FakeFleet({"h1": (0, 0)})
    provider = FakeProvider(gpus_per_host=4)
    scaler = autoscaler(fleet, provider, max_hosts=3)
    await provider.start_host()  # started, not registered yet
    assert scaler.pending({"h1"}) == 1
    assert scaler.pending({"h1", "auto-1"}) == 0
    assert scaler.addable_host_size(2) == 4
    assert scaler.addable_host_size(3) == 0, "at max_hosts nothing more can be added"
    assert autoscaler(fleet, provider).addable_host_size(99) == 4, "no limit"


class Retirement:
    """Stands in for the gateway's host registry: records what it is told, in order."""

    def __init__(self, provider: FakeProvider) -> None:
        self.provider = provider
        self.told: list[tuple[str, str, tuple[str, ...]]] = []

    def stopping(self, host_id: str) -> None:
        self.told.append(("stopping", host_id, self.provider.hosts()))

    def forget(self, host_id: str) -> None:
        self.told.append(("forget", host_id, self.provider.hosts()))


async def test_a_fleet_that_can_be_told_hears_stopping_then_forget() -> None:
    fleet = FakeFleet({"h1": (0, 0)})
    provider = FakeProvider()
    await provider.start_host()
    fleet.hosts["auto-1"] = (0, 0)
    retirement = Retirement(provider)
    scaler = autoscaler(fleet, provider, hosts=retirement)
    assert (await scaler.run_once()).stopped == ("auto-1",)
    assert retirement.told == [
        ("stopping", "auto-1", ("auto-1",)),  # before the provider stops it
        ("forget", "auto-1", ()),
    ]
    # the fleet forgets it itself; until it does, its snapshot is taken as it is
    assert [h.id for h in scaler.snapshot().alive_hosts()] == ["h1", "auto-1"]


async def test_a_host_that_cannot_be_stopped_is_not_forgotten() -> None:
    fleet = FakeFleet({"h1": (0, 0)})
    provider = FakeProvider()
    await provider.start_host()
    fleet.hosts["auto-1"] = (0, 0)

    async def refuse(host_id: str) -> None:
        raise HostLimitReached("cannot stop")

    provider.stop_host = refuse
    retirement = Retirement(provider)
    result = await autoscaler(fleet, provider, hosts=retirement).run_once()
    assert result.skipped == (("auto-1", "stopping failed: cannot stop"),)
    assert [event for event, _, _ in retirement.told] == ["stopping"], "it stays closed"


async def test_with_a_spot_share_it_adds_spot_hosts_within_the_share_counting_those_on_the_way():
    fleet = FakeFleet({"h1": (2, 1)}, waiting=8)  # 10 GPUs wanted, 2 per host -> 5 hosts
    provider = FakeProvider()
    scaler = autoscaler(fleet, provider, spot_share=0.5)
    assert (await scaler.run_once()).started == ("auto-1", "auto-2", "auto-3", "auto-4")
    assert provider.kinds == [SPOT, ON_DEMAND, SPOT, ON_DEMAND]
    fleet.waiting = 12  # 7 hosts: 2 more, while the 4 (2 of them spot) have not registered
    assert (await scaler.run_once()).started == ("auto-5", "auto-6")
    assert provider.kinds[4:] == [SPOT, ON_DEMAND], "3 spot of 6, then 3 of 7"
    assert scaler.model()["spot_share"] == 0.5


async def test_without_a_spot_share_every_host_is_the_providers_kind():
    provider = FakeProvider()
    await autoscaler(FakeFleet({"h1": (2, 1)}, waiting=4), provider).run_once()
    assert provider.kinds == [None, None]
    with pytest.raises(ValueError, match="spot_share must be within"):
        autoscaler(FakeFleet(), provider, spot_share=1.5)
