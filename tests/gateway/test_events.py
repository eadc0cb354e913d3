"""Fleet events: the bus (`kernelfleet.gateway.events`) and, live, what the gateway publishes
on ``GET /api/fleet/events`` and the ``/api/fleet/events/stream`` websocket, with the kernel
model's per-kernel fields."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.gateway.event_schemas import SCHEMAS, EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.testing import wait_for

# ---- the bus -------------------------------------------------------------------------------


def test_events_are_numbered_in_order_and_the_ring_keeps_the_last_ones():
    bus = EventBus(validate=True, ring_size=5, clock=lambda: 12.5)
    for i in range(8):
        bus.publish(EventType.HOST_LOST, {"why": f"#{i}"}, host_id="host-1")
    kept = bus.recent(100)
    assert [event["seq"] for event in kept] == [4, 5, 6, 7, 8]
    assert kept[-1] == {
        "seq": 8,
        "time": 12.5,
        "type": "host-lost",
        "kernel_id": None,
        "host_id": "host-1",
        "data": {"why": "#7"},
    }
    assert [event["seq"] for event in bus.recent(2)] == [7, 8]
    assert [event["seq"] for event in bus.since(6)] == [7, 8]
    assert bus.invalid == 0


def test_recent_and_since_filter_by_kernel():
    bus = EventBus(validate=True)
    for kernel in ["a", "b", "a", None]:
        bus.publish(EventType.KERNEL_STOPPED, {"why": "shut down"}, kernel_id=kernel)
    assert [event["seq"] for event in bus.recent(10, "a")] == [1, 3]
    assert [event["seq"] for event in bus.recent(1, "a")] == [3]
    assert [event["seq"] for event in bus.since(1, "a")] == [3]
    assert bus.recent(10, "c") == []


async def test_a_slow_subscriber_loses_events_and_is_told_how_many_the_bus_never_waits():
    bus = EventBus(validate=True, queue_size=4)
    slow = bus.subscribe()
    fast = bus.subscribe(kernel_id="k")
    for i in range(10):
        started = time.perf_counter()
        bus.publish(EventType.KERNEL_STOPPED, {"why": str(i)}, kernel_id="k")
        assert time.perf_counter() - started < 0.01
        assert (await anext(fast))["seq"] == i + 1
    assert slow.missed == 6
    taken = [await anext(slow) for _ in range(4)]
    assert [event["seq"] for event in taken] == [1, 2, 3, 4]
    bus.publish(EventType.KERNEL_STOPPED, {"why": "late"}, kernel_id="k")
    notice, late = await anext(slow), await anext(slow)
    assert notice["type"] == "events-missed"
    assert notice["data"] == {"missed": 6, "first_seq": 5, "last_seq": 10}
    assert notice["seq"] == 10
    assert bus.check(notice)
    assert late["seq"] == 11
    slow.close()
    fast.close()
    assert bus.subscribers == 0


async def test_a_subscriber_since_a_seq_gets_the_kept_backlog_first_then_live_events():
    bus = EventBus(validate=True, ring_size=3, queue_size=2)
    for i in range(6):
        bus.publish(EventType.HOST_LOST, {"why": str(i)}, host_id="h")
    subscription = bus.subscribe(since=1)
    bus.publish(EventType.HOST_LOST, {"why": "live"}, host_id="h")
    got = [await anext(subscription) for _ in range(5)]
    assert got[0]["type"] == "events-missed"
    assert got[0]["data"] == {"missed": 2, "first_seq": 2, "last_seq": 3}
    assert [event["seq"] for event in got[1:]] == [4, 5, 6, 7], "the backlog is not cut"
    subscription.close()
    with pytest.raises(StopAsyncIteration):
        await anext(subscription)


def test_validation_catches_an_event_that_does_not_match_its_schema(caplog):
    bus = EventBus(validate=True)
    bus.publish(EventType.CELL_WAITING, {"cell_id": "c", "gpus": 1})
    assert bus.invalid == 1
    assert "does not match its schema" in caplog.text
    assert len(bus.recent()) == 1, "published all the same"
    unchecked = EventBus()
    unchecked.publish(EventType.CELL_WAITING, {"cell_id": "c"})
    assert unchecked.invalid == 0


def test_every_event_type_has_a_schema_and_is_documented():
    contract = (Path(__file__).parents[2] / "docs" / "gateway-contract.md").read_text()
    section = contract.split("## Events", 1)[1].split("\n## ", 1)[0]
    for event_type in EventType:
        assert SCHEMAS[event_type]["properties"]["type"]["const"] == event_type.value
        fields = SCHEMAS[event_type]["properties"]["data"]["properties"]
        row = re.search(rf"^\| `{event_type.value}` \|(.*)$", section, re.M)
        assert row, f"{event_type.value} is not in docs/gateway-contract.md's Events table"
        for name in fields:
            assert f"`{name}`" in row.group(1), f"{event_type.value}: `{name}` undocumented"


# ---- live ------------------------------------------------------------------------------------

SLEEP = "import time; time.sleep({s}); print('slept')"


@pytest.fixture(scope="module")
def one_gpu(fleet_factory):
    """One host with one GPU: a second kernel's cell waits while the first's runs. Events are
    validated against their schemas as the gateway publishes them."""
    return fleet_factory(hosts=1, gpus=1, replicas=1, env={"KERNELFLEET_VALIDATE_EVENTS": "1"})


def events(fleet, query=""):
    return fleet.api("GET", f"/api/fleet/events{query}")


def of_cell(found, cell_id):
    """The cell's own events (``cell-*``) by type, in order."""
    return {
        event["type"]: event
        for event in found
        if event["type"].startswith("cell-") and event["data"]["cell_id"] == cell_id
    }


async def stream(fleet, query="", token=None):
    headers = {"Authorization": f"token {fleet.token if token is None else token}"}
    url = fleet.url.replace("http", "ws", 1) + f"/api/fleet/events/stream{query}"
    return await websocket_connect(HTTPRequest(url, headers=headers))


async def next_event(ws, timeout=1.0):
    message = await asyncio.wait_for(ws.read_message(), timeout)
    assert message is not None, "the stream closed"
    return json.loads(message)


async def test_a_cell_that_waits_for_the_gpu_says_why_when_it_starts(one_gpu):
    fleet = one_gpu
    start = {"KERNEL_GPUS": "1", "KERNEL_USERNAME": "ada", "JPY_SESSION_NAME": "/work/nb.ipynb"}
    busy_id, waiting_id = (fleet.start_kernel(env=start) for _ in range(2))
    busy, waiting = await fleet.connect(busy_id), await fleet.connect(waiting_id)
    try:
        first = busy.send("execute_request", {"code": SLEEP.format(s=3)})
        wait_for(lambda: of_cell(events(fleet), first).get("cell-started"), 20, "the first cell")
        held = fleet.api("GET", f"/api/fleet/kernels/{busy_id}")
        assert held["gpus_held"] == [{"host": "host-1", "devices": ["0"]}]
        second = waiting.send("execute_request", {"code": "print('ran')"})
        wait_for(
            lambda: fleet.api("GET", f"/api/fleet/kernels/{waiting_id}")["queued_cells"] == 1,
            10,
            "the second cell to queue",
        )
        waiting_now = wait_for(
            lambda: fleet.api("GET", f"/api/fleet/kernels/{waiting_id}")["waiting"],
            10,
            "the kernel model to say why its cell waits",
        )
        assert (waiting_now["cell_id"], waiting_now["gpus"]) == (second, 1)
        assert (await waiting.collect(second, timeout=30)).reply["status"] == "ok"
        await busy.collect(first, timeout=30)

        mine = of_cell(events(fleet, f"?kernel={waiting_id}"), second)
        assert list(mine) == ["cell-queued", "cell-waiting", "cell-started", "cell-finished"]
        waited = mine["cell-waiting"]["data"]
        assert (waited["gpus"], waited["cells_ahead"]) == (1, 0)
        assert waited["reason"] == "GPUs to be released"
        started = mine["cell-started"]
        assert (started["host_id"], started["data"]["devices"]) == ("host-1", ["0"])
        assert started["data"]["start_delay_s"] > 1
        assert re.fullmatch(r"waited \d+\.\d s for 1 GPU", started["data"]["waited"])
        assert mine["cell-finished"]["data"]["outcome"] == "ok"
        gpus = [e for e in events(fleet, f"?kernel={waiting_id}") if e["type"].startswith("gpus")]
        assert [(e["type"], e["data"]["cell_id"], e["data"]["devices"]) for e in gpus] == [
            ("gpus-committed", second, ["0"]),
            ("gpus-released", second, ["0"]),
        ]
        everyone = events(fleet, "?n=1000")
        assert all(e["kernel_id"] == waiting_id for e in events(fleet, f"?kernel={waiting_id}"))
        assert {"gpus-committed", "gpus-released", "kernel-started", "host-added"} <= {
            event["type"] for event in everyone
        }
        assert [e["seq"] for e in everyone] == sorted({e["seq"] for e in everyone})

        model = fleet.api("GET", f"/api/fleet/kernels/{waiting_id}")
        assert (model["gpus"], model["gpus_held"], model["queued_cells"]) == (1, [], 0)
        assert model["waiting"] is None
        assert (model["notebook_path"], model["user"]) == ("/work/nb.ipynb", "ada")
        assert model["last_activity"] > time.time() - 60
        cell = model["recent_cells"][-1]
        assert (cell["id"], cell["outcome"], cell["host"]) == (second, "ok", "host-1")
        assert cell["waited"] == started["data"]["waited"]
        assert cell["start_delay_s"] == pytest.approx(started["data"]["start_delay_s"])
    finally:
        busy.close()
        waiting.close()
        for kernel_id in (busy_id, waiting_id):
            fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert "does not match its schema" not in fleet.log()


async def test_the_stream_delivers_a_live_event_within_a_second(one_gpu):
    fleet = one_gpu
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    ws = await stream(fleet, f"?kernel={kernel_id}")
    try:
        sent = time.monotonic()
        cell = client.send("execute_request", {"code": "1"})
        queued = await next_event(ws)
        assert time.monotonic() - sent < 1
        assert (queued["type"], queued["data"]["cell_id"]) == ("cell-queued", cell)
        await client.collect(cell)
        got = [await next_event(ws) for _ in range(2)]
        assert [event["type"] for event in got] == ["cell-started", "cell-finished"]
        # a reconnect since the first event gets the rest again, in order
        again = await stream(fleet, f"?kernel={kernel_id}&since={queued['seq']}")
        assert [(await next_event(again))["seq"] for _ in range(2)] == [e["seq"] for e in got]
        again.close()
    finally:
        ws.close()
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


@pytest.mark.parametrize(
    ("query", "token", "status", "reason"),
    [
        ("", "", 401, "unauthorized"),
        ("", "not-the-token", 403, "forbidden"),
        ("?kernel=nope", None, 404, "not-found"),
        ("?since=-1", None, 400, "invalid-request"),
    ],
)
async def test_the_stream_refuses_before_the_upgrade(one_gpu, query, token, status, reason):
    with pytest.raises(HTTPClientError) as refused:
        await stream(one_gpu, query, token)
    assert refused.value.code == status
    assert refused.value.response is not None
    assert json.loads(refused.value.response.body)["reason"] == reason


def test_the_list_checks_its_arguments(one_gpu):
    for query, status in [("?kernel=nope", 404), ("?n=0", 400), ("?n=1001", 400), ("?n=x", 400)]:
        got, body = one_gpu.request("GET", f"/api/fleet/events{query}")
        assert got == status, (query, body)
    assert one_gpu.request("GET", "/api/fleet/events", token="")[0] == 401
    assert one_gpu.request("GET", "/api/fleet/events", token="not-the-token")[0] == 403
    assert len(events(one_gpu, "?n=1")) == 1
