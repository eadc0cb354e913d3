"""Host agents the gateway must refuse: a wrong token, and a second agent claiming a live host's id.

Both keep trying (the agent logs the refusal once, as an ERROR); the gateway answers 401 / 409,
logs each refused agent once (not at every beat), and leaves the fleet as it was.
"""

from __future__ import annotations

import asyncio

import pytest

from kernelfleet.gateway.processes import host_agent_args
from kernelfleet.testing import call_json, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def heartbeat(fleet, host_id: str, body: dict, token: str) -> tuple[int, dict]:
    return call_json(f"{fleet.url}/api/fleet/hosts/{host_id}", "PUT", token, body)


async def test_an_agent_with_a_wrong_token_is_refused_and_logged_once(fleet_factory):
    fleet = fleet_factory(hosts=1, gpus=1)
    args = host_agent_args(fleet.url, "host-x", 1, fleet.state_dir / "host-x")
    agent = fleet.spawn("host-x", *args, "--token", "not-the-token", "--heartbeat-interval", "0.2")
    try:
        wait_for(lambda: "refuses this agent" in fleet.log("host-x"), 30, "the agent to say so")
        said = "refused host agent 'host-x' at 127.0.0.1: wrong fleet token"
        wait_for(lambda: said in fleet.log(), 10, "the gateway to log it")
        await asyncio.sleep(2)  # ten more beats, all refused
        assert fleet.log().count(said) == 1, "once per agent, not per beat"
        assert fleet.log("host-x").count("refuses this agent") == 1
        assert "HTTP 401" in fleet.log("host-x")
        assert agent.poll() is None, "it keeps trying"
        assert fleet.host_state("host-x") is None, "never registered"

        body = {"id": "host-y", "address": "http://127.0.0.1:1", "gpus": [], "replicas": []}
        status, answer = heartbeat(fleet, "host-y", body, "wrong")
        assert (status, answer["reason"]) == (401, "unauthorized")
        status, _ = call_json(f"{fleet.url}/api/fleet/hosts/host-y/link?instance=i", "GET", "wrong")
        assert status == 401
        assert fleet.host_state("host-y") is None
    finally:
        agent.kill()
        agent.wait(10)


async def test_a_second_agent_claiming_a_live_host_id_is_refused_and_the_first_is_left_alone(
    fleet_factory,
):
    fleet = fleet_factory(hosts=2, gpus=1, replicas=2)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    first = fleet.api("GET", "/api/fleet/hosts/host-1")
    before = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    args = host_agent_args(fleet.url, "host-1", 1, fleet.state_dir / "host-1-twin")
    twin = fleet.spawn("host-1-twin", *args, "--heartbeat-interval", "0.2")
    try:
        assert (await client.execute("n = 1")).reply["status"] == "ok"
        wait_for(lambda: "refuses this agent" in fleet.log("host-1-twin"), 30, "the twin to say so")
        twin_log = fleet.log("host-1-twin")
        assert "HTTP 409 host-id-taken" in twin_log
        assert f"host host-1 is already registered by the agent at {first['address']}" in twin_log
        said = "refused a second agent claiming host host-1"
        wait_for(lambda: said in fleet.log(), 10, "the gateway to log it")
        await asyncio.sleep(2)
        assert fleet.log().count(said) == 1, "once per agent, not per beat"
        assert twin.poll() is None, "it keeps trying, in case the first one is lost"

        assert fleet.api("GET", "/api/fleet/hosts/host-1") == first, "the first is left alone"
        assert fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"] == before
        assert (await client.execute("print(n)")).stdout == "1\n"
        events = fleet.api("GET", "/api/fleet/events?n=1000")
        assert not [e for e in events if e["type"] in ("host-lost", "replica-lost")]

        agent = call_json(f"{first['address']}/api/host", token=fleet.token)[1]
        body = {**agent, "address": "http://127.0.0.1:1", "instance": "another"}
        status, answer = heartbeat(fleet, "host-1", body, fleet.token)
        assert (status, answer["reason"]) == (409, "host-id-taken")
        assert first["address"] in answer["message"]
        assert "host-1" in answer["message"]
    finally:
        client.close()
        twin.kill()
        twin.wait(10)
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
