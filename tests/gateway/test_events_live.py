"""Fleet events of replicas and hosts, live: what ``GET /api/fleet/events`` and the
``/api/fleet/events/stream`` websocket say when a replica is migrated or lost, and when a host
is drained or lost (the cell and GPU events are in test_events.py).

Events are checked against their jupyter_events schemas as the gateway publishes them
(``KERNELFLEET_VALIDATE_EVENTS=1``); a mismatch counts in the gateway's log at ERROR, which each
test reads back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from kernelfleet.testing import Fleet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

VALIDATE = {"KERNELFLEET_VALIDATE_EVENTS": "1"}
HOSTS = {"host-1", "host-2", "host-3", "host-4"}


@pytest.fixture(scope="module")
def four_hosts(fleet_factory: Callable[..., Fleet]) -> Fleet:
    """Four hosts without GPUs; kernels of three replicas (two still make a majority when one
    is lost), so a fourth host is free to move to. The tests leave it healthy."""
    return fleet_factory(hosts=4, gpus=0, replicas=3, env=VALIDATE)


def events(fleet: Fleet, query: str = "") -> list[dict[str, Any]]:
    return list(fleet.api("GET", f"/api/fleet/events{query}"))


def of_type(fleet: Fleet, event_type: str, query: str = "?n=1000") -> list[dict[str, Any]]:
    return [event for event in events(fleet, query) if event["type"] == event_type]


def no_invalid_events(fleet: Fleet) -> None:
    assert "does not match its schema" not in fleet.log("gateway")


async def stream(fleet: Fleet, query: str) -> WebSocketClientConnection:
    url = fleet.url.replace("http", "ws", 1) + f"/api/fleet/events/stream{query}"
    headers = {"Authorization": f"token {fleet.token}"}
    return await websocket_connect(HTTPRequest(url, headers=headers))


async def read_until(ws: WebSocketClientConnection, event_type: str, timeout: float) -> list[dict]:
    """The events `ws` sends, up to and including the first of `event_type`."""
    got: list[dict] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while not got or got[-1]["type"] != event_type:
        left = deadline - asyncio.get_running_loop().time()
        message = await asyncio.wait_for(ws.read_message(), max(left, 0.01))
        assert message is not None, f"the stream closed; it sent {got}"
        got.append(json.loads(message))
    return got


def replicas(fleet: Fleet, kernel_id: str) -> list[dict[str, Any]]:
    return list(fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"])


async def test_a_migrated_replica_says_from_which_host_to_which(four_hosts: Fleet) -> None:
    fleet = four_hosts
    kernel_id = fleet.start_kernel()
    before = replicas(fleet, kernel_id)
    (free,) = HOSTS - {replica["host"] for replica in before}
    ws = await stream(fleet, f"?kernel={kernel_id}")
    try:
        moved = fleet.api("POST", f"/api/fleet/kernels/{kernel_id}/migrate", {"host": free})
        assert moved["to_host"] == free
        live = await read_until(ws, "replica-migrated", timeout=30)
    finally:
        ws.close()
    (event,) = of_type(fleet, "replica-migrated", f"?kernel={kernel_id}")
    assert live[-1] == event, "the stream and the list say the same"
    assert (event["kernel_id"], event["host_id"]) == (kernel_id, free)
    assert event["data"]["replica_id"] == moved["replica_id"]
    assert (event["data"]["from_host"], event["data"]["to_host"]) == (moved["from_host"], free)
    assert event["data"]["replaced"] in {replica["id"] for replica in before}
    assert free in {replica["host"] for replica in replicas(fleet, kernel_id)}
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    no_invalid_events(fleet)


async def test_a_killed_replica_is_lost_then_replaced(four_hosts: Fleet) -> None:
    fleet = four_hosts
    kernel_id = fleet.start_kernel()
    doomed, *survivors = replicas(fleet, kernel_id)
    ws = await stream(fleet, f"?kernel={kernel_id}")
    try:
        os.kill(doomed["pid"], signal.SIGKILL)
        live = await read_until(ws, "replica-replaced", timeout=40)
    finally:
        ws.close()
    types = [event["type"] for event in live]
    assert "replica-lost" in types, types
    assert types.index("replica-lost") < types.index("replica-replaced")
    lost = live[types.index("replica-lost")]
    assert (lost["kernel_id"], lost["host_id"]) == (kernel_id, doomed["host"])
    assert lost["data"]["replica_id"] == doomed["id"]
    assert lost["data"]["why"]
    replaced = live[-1]
    assert replaced["data"]["replaced"] == doomed["id"]
    assert replaced["data"]["from_host"] == doomed["host"]
    assert replaced["data"]["to_host"] not in {r["host"] for r in survivors}, "two on one host"
    now = {replica["id"]: replica for replica in replicas(fleet, kernel_id)}
    new = now[replaced["data"]["replica_id"]]
    assert (new["host"], new["state"]) == (replaced["data"]["to_host"], "ready")
    assert [
        e["type"] for e in events(fleet, f"?kernel={kernel_id}") if "replica-" in e["type"]
    ] == [
        "replica-lost",
        "replica-replaced",
    ]
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    no_invalid_events(fleet)


def scaled_in(fleet: Fleet) -> bool:
    return any(d["data"]["stopped"] for d in of_type(fleet, "autoscaler-decision"))


def test_a_killed_host_agent_is_lost(private_fleet: Callable[..., Fleet]) -> None:
    fleet = private_fleet(hosts=2, gpus=0, replicas=1, env=VALIDATE)
    assert {event["host_id"] for event in of_type(fleet, "host-added")} == {"host-1", "host-2"}
    fleet.signal_host("host-2", signal.SIGKILL)
    (lost,) = wait_for(lambda: of_type(fleet, "host-lost"), 20, "a host-lost event")
    assert (lost["host_id"], lost["kernel_id"]) == ("host-2", None)
    assert "connection to the gateway closed" in lost["data"]["why"], "its link told, at once"
    assert fleet.host_state("host-2") == "lost"
    no_invalid_events(fleet)


AUTOSCALING = (
    "--autoscale", "--min-hosts", "1", "--max-hosts", "2",
    "--GatewayApp.autoscale_interval=0.3", "--GatewayApp.autoscale_patience=2",
    "--GatewayApp.autoscale_cooldown=0", "--GatewayApp.autoscale_buffer_hosts=1",
    "--GatewayApp.autoscale_headroom=1.0", "--GatewayApp.autoscale_gpus_per_host=1",
)  # fmt: skip


async def test_an_added_host_is_drained_when_idle(private_fleet: Callable[..., Fleet]) -> None:
    """One hand-started host of 1 GPU and one idle host kept beyond the demand: a cell that
    holds the GPU makes the autoscaler add ``auto-1``; once the cell is interrupted, auto-1 is
    the idle host too many, and it is drained (nothing to move) and stopped."""
    fleet = private_fleet(hosts=1, gpus=1, replicas=1, env=VALIDATE, gateway_args=AUTOSCALING)
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    kernel = await fleet.connect(kernel_id)
    try:
        cell = kernel.send("execute_request", {"code": "import time; time.sleep(60)"})
        wait_for(lambda: fleet.host_state("auto-1") == "alive", 40, "auto-1 to be added")
        fleet.api("POST", f"/api/kernels/{kernel_id}/interrupt", expect=204)
        await kernel.collect(cell, timeout=20)
        wait_for(lambda: scaled_in(fleet), 30, "auto-1 to be drained and stopped")
    finally:
        kernel.close()
    hosts = [e for e in events(fleet, "?n=1000") if e["host_id"] == "auto-1"]
    types = [event["type"] for event in hosts]
    assert types[:3] == ["host-added", "host-draining", "host-drained"], types
    assert hosts[1]["data"] == {"replicas": 0}
    assert hosts[2]["data"] == {"moved": 0}
    acted = [
        (d["data"]["action"], d["data"]["started"], d["data"]["stopped"])
        for d in of_type(fleet, "autoscaler-decision")
        if d["data"]["started"] or d["data"]["stopped"]
    ]
    assert acted == [("scale-out", ["auto-1"], []), ("scale-in", [], ["auto-1"])], acted
    no_invalid_events(fleet)
