"""The live autoscaler dates hosts for the rule's idle time and minimum lifetime
(`AutoscaleConfig.scale_in_idle_s`, ``min_host_lifetime_s``): on its own clock, from the rounds
that saw them."""

from __future__ import annotations

from kernelfleet.scheduler import ScaleIn

from .test_autoscaler import Clock, FakeFleet, FakeProvider, autoscaler, policy


async def test_a_host_is_released_only_once_idle_and_old_enough_on_the_rounds_clock() -> None:
    clock = Clock()  # 1000 s
    fleet = FakeFleet({"h1": (2, 0)})
    provider = FakeProvider()
    await provider.start_host()
    fleet.hosts["auto-1"] = (1, 0)  # busy when first seen
    steady = policy(scale_in_idle_s=60.0, min_host_lifetime_s=100.0)
    scaler = autoscaler(fleet, provider, clock=clock, policy=steady)
    assert (await scaler.run_once()).stopped == ()
    snapshot = scaler.snapshot()
    assert snapshot.now == 1000.0
    dated = snapshot.host("auto-1")
    assert dated is not None
    assert dated.started_at == 1000.0
    clock.now = 1050.0
    fleet.hosts["auto-1"] = (0, 0)  # idle from this round on
    assert (await scaler.run_once()).stopped == ()
    clock.now = 1109.0  # up 109 s, idle 59 s
    assert (await scaler.run_once()).stopped == ()
    clock.now = 1110.0
    result = await scaler.run_once()
    assert result.decision == ScaleIn(("auto-1",))
    assert result.stopped == ("auto-1",)


async def test_without_the_knobs_an_idle_host_goes_at_the_first_round() -> None:
    clock = Clock()
    fleet = FakeFleet({"h1": (2, 0)})
    provider = FakeProvider()
    await provider.start_host()
    fleet.hosts["auto-1"] = (0, 0)
    scaler = autoscaler(fleet, provider, clock=clock)
    assert (await scaler.run_once()).stopped == ("auto-1",)
