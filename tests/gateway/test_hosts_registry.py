"""HostRegistry's liveness rules without processes: links, a second agent, refused tokens.

A link's close loses its host only if it is the host's current agent's current link, and never
once the gateway stops; a second agent on a live host id is refused, a restarted one (same
address) or one taking over a lost host is not; a wrong token is logged once per agent.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from kernelfleet.errors import Conflict, InvalidRequest, NotFound
from kernelfleet.gateway.hosts import HostRecord, HostRegistry, HostState


class Listener:
    def __init__(self) -> None:
        self.lost: list[str] = []
        self.reports: list[tuple[str, bool]] = []

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        self.reports.append((host.id, restarted))

    def on_host_lost(self, host: HostRecord) -> None:
        self.lost.append(host.id)


def report(address: str = "http://10.0.0.1:9000", instance: str = "a") -> dict:
    return {"address": address, "instance": instance, "gpus": [], "replicas": []}


@pytest.fixture
def registry():
    hosts = HostRegistry("token", heartbeat_timeout=5.0)
    listener = Listener()
    hosts.listen(listener)
    changes: list[int] = []
    hosts.watch(lambda: changes.append(1))
    yield hosts, listener, changes
    hosts.close()


def test_a_closed_link_loses_its_host_at_once_and_says_why(registry) -> None:
    hosts, listener, _ = registry
    hosts.report("h1", report(), now=0.0)
    link = hosts.link_opened("h1", "a")
    assert hosts.link_closed("h1", link, "its agent's connection closed") is not None
    host = hosts.get("h1")
    assert (host.state, host.lost_why, listener.lost) == (
        HostState.LOST,
        "its agent's connection closed",
        ["h1"],
    )
    assert hosts.link_closed("h1", link, "again") is None, "lost once"
    assert listener.lost == ["h1"]


def test_an_old_or_unknown_link_closing_changes_nothing(registry) -> None:
    hosts, listener, _ = registry
    hosts.report("h1", report(), now=0.0)
    old = hosts.link_opened("h1", "a")
    new = hosts.link_opened("h1", "a")  # the agent reconnected; the old socket closes late
    assert hosts.link_closed("h1", old, "late close") is None
    assert hosts.link_closed("h9", new, "no such host") is None
    assert hosts.get("h1").state is HostState.ALIVE
    hosts.report("h1", report(instance="b"), now=1.0)  # restarted: the old agent's link is void
    assert hosts.link_closed("h1", new, "the old agent's link") is None
    assert (hosts.get("h1").state, listener.lost) == (HostState.ALIVE, [])


def test_links_closing_while_the_gateway_stops_lose_no_host(registry) -> None:
    hosts, listener, _ = registry
    hosts.report("h1", report(), now=0.0)
    link = hosts.link_opened("h1", "a")
    hosts.close()
    assert hosts.link_closed("h1", link, "the gateway stops") is None
    assert listener.lost == []


def test_a_link_needs_a_registered_host_and_its_current_agent(registry) -> None:
    hosts, _, _ = registry
    with pytest.raises(NotFound):
        hosts.check_link("h1", "a")
    hosts.report("h1", report(), now=0.0)
    with pytest.raises(Conflict, match="registered by another agent"):
        hosts.check_link("h1", "someone-else")


def test_a_second_agent_on_a_live_host_is_refused_a_restarted_or_successor_is_not(
    registry, caplog
) -> None:
    hosts, listener, changes = registry
    hosts.report("h1", report(), now=0.0)
    for _ in range(3):
        with pytest.raises(Conflict) as refused:
            hosts.report("h1", report("http://10.0.0.2:9000", "b"), now=1.0)
    assert refused.value.reason == "host-id-taken"
    assert "http://10.0.0.1:9000" in refused.value.message
    assert "h1" in refused.value.message
    assert caplog.text.count("refused a second agent claiming host h1") == 1
    assert (hosts.get("h1").address, hosts.get("h1").instance) == ("http://10.0.0.1:9000", "a")

    hosts.report("h1", report(instance="c"), now=2.0)  # same address: the agent restarted
    assert listener.reports[-1] == ("h1", True)

    hosts.check_liveness(now=10.0)  # it went silent: lost
    hosts.report("h1", report("http://10.0.0.2:9000", "b"), now=11.0)  # the other takes over
    assert hosts.get("h1").address == "http://10.0.0.2:9000"
    assert len(changes) == 2, "registered, then back: each wakes what waits for a host"


def test_a_wrong_token_is_logged_once_per_agent(registry, caplog) -> None:
    hosts, _, _ = registry
    caplog.set_level(logging.ERROR)
    for _ in range(5):
        hosts.refuse_token("h1", "10.0.0.1")
    hosts.refuse_token("h2", "10.0.0.2")
    assert caplog.text.count("wrong fleet token") == 2


def test_late_heartbeats_lose_a_host_without_a_link_but_not_one_whose_link_is_open(
    registry,
) -> None:
    """A linked agent answers the link's pings: late heartbeats mean it is busy or the gateway
    stalled, not that it is gone. Its link's close loses it; an unlinked host is judged by its
    heartbeats."""
    hosts, listener, _ = registry
    hosts.report("h1", report(), now=0.0)
    hosts.report("h2", report("http://10.0.0.2:9000", "b"), now=0.0)
    link = hosts.link_opened("h1", "a")
    assert [host.id for host in hosts.check_liveness(now=6.0)] == ["h2"]
    assert hosts.get("h1").state is HostState.ALIVE
    assert hosts.get("h2").lost_why == "missed its heartbeats for 6.0 s"
    assert hosts.link_closed("h1", link, "its agent's connection closed") is not None
    assert hosts.get("h1").lost_why == "its agent's connection closed"
    assert listener.lost == ["h2", "h1"]


async def test_the_liveness_watch_judges_nobody_right_after_the_gateway_stalled() -> None:
    """A stall of the gateway's loop longer than the heartbeat timeout (a long write, say) left
    every host's heartbeats queued; the round that wakes late judges nobody, and the queued
    heartbeats are applied before the next. A host that really went silent is lost after."""
    hosts = HostRegistry("token", heartbeat_timeout=0.3)
    listener = Listener()
    hosts.listen(listener)
    stop = asyncio.Event()
    hosts.report("h1", report(), now=time.monotonic())
    hosts.report("h2", report("http://10.0.0.2:9000", "b"), now=time.monotonic())
    watch = asyncio.create_task(hosts.watch_liveness(0.05, stop))
    await asyncio.sleep(0.1)
    time.sleep(0.5)  # noqa: ASYNC251 - the stall itself: nothing on the loop runs
    await asyncio.sleep(0)  # the watch's late round comes first, as after a real stall
    hosts.report("h1", report(), now=time.monotonic())  # the heartbeats that queued up
    hosts.report("h2", report("http://10.0.0.2:9000", "b"), now=time.monotonic())
    await asyncio.sleep(0.15)
    assert listener.lost == []
    for _ in range(10):  # h1 keeps beating; h2 went silent for good
        hosts.report("h1", report(), now=time.monotonic())
        await asyncio.sleep(0.05)
    stop.set()
    await watch
    assert listener.lost == ["h2"]


def test_a_host_says_its_kind_and_a_bad_kind_is_refused_naming_the_field(registry) -> None:
    hosts, _, _ = registry
    assert hosts.report("h1", report(), now=0.0).kind == "on-demand"
    assert hosts.report("h2", {**report(instance="s"), "kind": "spot"}, now=0.0).kind == "spot"
    with pytest.raises(InvalidRequest, match="a host report's 'kind' must be one of on-demand, "):
        hosts.report("h3", {**report(instance="x"), "kind": "cheap"}, now=0.0)
    assert "h3" not in {host.id for host in hosts.all()}
