"""Kernel-scoped tokens (`kernelfleet.gateway.kernel_tokens`): what a kernel's own token may do.

The unit tests check issuing and verifying. The live tests run a real fleet: every route the
gateway serves (read from `routes()`, so a route added without a decision here fails) is
called with a kernel's token, for its own kernel and for another, and must answer what the
contract allows; a forged token or one of a kernel gone is refused (401) and logged; a real
replica holds its kernel's token and the gateway's URL, never the fleet token, and a cell can
use them.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.web import RequestHandler
from tornado.websocket import websocket_connect

from kernelfleet.gateway.handlers import routes
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.testing import wait_for

pytestmark = pytest.mark.timeout(240)

KERNEL = "3f2a9c1e-0d4b-4e8a-9b1c-2d3e4f5a6b7c"

# ---- unit ----------------------------------------------------------------------------------


def test_a_token_names_its_kernel_and_verifies_with_the_same_fleet_token():
    tokens = KernelTokens("the-fleet-token")
    token = tokens.issue(KERNEL)
    assert token.startswith(f"kfk1.{KERNEL}.")
    assert token == tokens.issue(KERNEL), "stateless: the same token every time"
    assert KernelTokens("the-fleet-token").verify(token) == KERNEL, "a restarted gateway too"
    assert "the-fleet-token" not in token


def test_another_kernels_token_verifies_as_that_kernel_only():
    tokens = KernelTokens("the-fleet-token")
    other = tokens.issue("other-kernel")
    assert tokens.verify(other) == "other-kernel"
    # its mac does not pass for this kernel
    mac = other.rsplit(".", 1)[1]
    assert tokens.verify(f"kfk1.{KERNEL}.{mac}") is None


@pytest.mark.parametrize(
    "forged",
    [
        "kfk1.{k}.{mac_flipped}",
        "kfk1.{k}.",
        "kfk1.{k}",
        "kfk2.{k}.{mac}",
        "kfk1..{mac}",
        "kfk1.a.{k}.{mac}",
        "{mac}",
        "",
        "kfk1.{k}.{mac}x",
    ],
)
def test_a_forged_or_mangled_token_does_not_verify(forged):
    tokens = KernelTokens("the-fleet-token")
    mac = tokens.issue(KERNEL).rsplit(".", 1)[1]
    flipped = ("0" if mac[0] != "0" else "1") + mac[1:]
    assert tokens.verify(forged.format(k=KERNEL, mac=mac, mac_flipped=flipped)) is None


def test_a_token_signed_with_another_fleet_token_does_not_verify():
    assert KernelTokens("fleet-a-token").verify(KernelTokens("fleet-b-token").issue(KERNEL)) is None


# ---- live: every route, with a kernel's token ----------------------------------------------

OK, FORBIDDEN = "ok", 403
"""What a kernel token gets on a route: `OK`, anything the route answers past the token check
(200, or the 4xx its body earns: the check let it through); or `FORBIDDEN`."""

# (route pattern, method) -> (what the kernel's token gets for its own kernel, for another's)
DECISIONS: dict[tuple[str, str], tuple[object, object]] = {
    (r"/api/kernelspecs/?", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernelspecs/(?P<name>[^/]+)/?", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/kernelspecs/(?P<name>[^/]+)/(?P<filename>[^/]+)", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernels/?", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernels/?", "POST"): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernels/(?P<kernel_id>[\w-]+)/?", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernels/(?P<kernel_id>[\w-]+)/?", "DELETE"): (FORBIDDEN, FORBIDDEN),
    (
        r"/api/kernels/(?P<kernel_id>[\w-]+)/(?P<action>interrupt|restart)/?",
        "POST",
    ): (FORBIDDEN, FORBIDDEN),
    (r"/api/kernels/(?P<kernel_id>[\w-]+)/channels", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/?", "GET"): (OK, OK),
    (r"/api/fleet/openapi\.json", "GET"): (OK, OK),
    (r"/api/fleet/serving/?", "GET"): (OK, OK),
    (r"/api/fleet/hosts/?", "GET"): (OK, OK),
    (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/?", "GET"): (OK, OK),
    (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/?", "PUT"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/link", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/drain", "POST"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/hosts/(?P<host_id>[\w.-]+)/drain", "DELETE"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/kernels/?", "GET"): (FORBIDDEN, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/?", "GET"): (OK, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/migrate/?", "POST"): (OK, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/gpus/?", "PUT"): (OK, FORBIDDEN),
    # the clocks and power limits of its own running cell's GPUs (409 here: no cell runs)
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/gpu-settings/?", "GET"): (OK, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/gpu-settings/?", "PUT"): (OK, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/gpu-settings/?", "DELETE"): (OK, FORBIDDEN),
    # the tool workers of its own running cell (400 or 404 here: a harmless body, no group)
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/workers/?", "GET"): (OK, FORBIDDEN),
    (r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/workers/?", "POST"): (OK, FORBIDDEN),
    (
        r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/workers/(?P<group_id>wg-[\w-]+)/?",
        "GET",
    ): (OK, FORBIDDEN),
    (
        r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/workers/(?P<group_id>wg-[\w-]+)/?",
        "DELETE",
    ): (OK, FORBIDDEN),
    (
        r"/api/fleet/kernels/(?P<kernel_id>[\w-]+)/replicas/(?P<replica_id>[\w.-]+)/migrate/?",
        "POST",
    ): (FORBIDDEN, FORBIDDEN),
    # a kernel's token reads only its own events (its filter is forced: see the test below)
    (r"/api/fleet/events/?", "GET"): (OK, OK),
    (r"/api/fleet/events/stream", "GET"): (OK, OK),
    # background jobs: any kernel reads them, submits, sets the policy; cancelling another
    # kernel's job is refused by the handler (tests/gateway/test_jobs_live.py); only a job's own
    # token reports its progress
    (r"/api/fleet/jobs/?", "GET"): (OK, OK),
    (r"/api/fleet/jobs/?", "POST"): (OK, OK),
    (r"/api/fleet/jobs/policy/?", "GET"): (OK, OK),
    (r"/api/fleet/jobs/policy/?", "PUT"): (OK, OK),
    (r"/api/fleet/jobs/simulate/?", "POST"): (OK, OK),
    (r"/api/fleet/jobs/(?P<job_id>[\w-]+)/?", "GET"): (OK, OK),
    (r"/api/fleet/jobs/(?P<job_id>[\w-]+)/?", "DELETE"): (OK, OK),
    (r"/api/fleet/jobs/(?P<job_id>[\w-]+)/logs/?", "GET"): (OK, OK),
    (r"/api/fleet/jobs/(?P<job_id>[\w-]+)/progress/?", "POST"): (FORBIDDEN, FORBIDDEN),
    (r"/metrics", "GET"): (FORBIDDEN, FORBIDDEN),
    (r".*", "GET"): (FORBIDDEN, FORBIDDEN),
}

BODIES = {
    # harmless bodies: past the token check each earns an answer that changes nothing
    "POST": {"host": "no-such-host"},
    "PUT": {"gpus": 0},
}


def served_routes() -> set[tuple[str, str]]:
    """Every (pattern, method) the gateway serves: the methods its handler defines (GET for
    the catch-all, which answers in ``prepare``)."""
    found = set()
    for pattern, handler in routes():
        methods = {
            method
            for method in handler.SUPPORTED_METHODS
            if getattr(handler, method.lower()) is not getattr(RequestHandler, method.lower())
        }
        found |= {(pattern, method) for method in methods or {"GET"}}
    return found


def test_every_route_has_a_decision_for_kernel_tokens():
    assert served_routes() == set(DECISIONS), "decide what a kernel token may do on each route"


def concrete(pattern: str, kernel_id: str, replica_id: str) -> str:
    values = {
        "kernel_id": kernel_id,
        "replica_id": replica_id,
        "host_id": "host-1",
        "name": "python3",
        "filename": "logo-64x64.png",
        "action": "interrupt",
        "job_id": "job-00000000",
        "group_id": "wg-00000000",
    }
    if pattern == ".*":
        return "/no/such/endpoint"
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values[m.group(1)], pattern)
    return path.removesuffix("/?").replace("\\.", ".")


@pytest.fixture(scope="module")
def token_fleet(fleet_factory):
    """3 hosts, kernels of 2 replicas: a kernel can move to the third host."""
    return fleet_factory(hosts=3, gpus=1, replicas=2)


@pytest.fixture(scope="module")
def two_kernels(token_fleet):
    kernels = [token_fleet.start_kernel() for _ in range(2)]
    yield kernels
    for kernel_id in kernels:
        token_fleet.request("DELETE", f"/api/kernels/{kernel_id}")


def kernel_token(fleet, kernel_id):
    return KernelTokens(fleet.token).issue(kernel_id)


def test_a_kernel_token_gets_exactly_what_the_contract_allows_on_every_route(
    token_fleet, two_kernels
):
    fleet = token_fleet
    own, other = two_kernels
    token = kernel_token(fleet, own)
    replicas = {k: fleet.api("GET", f"/api/fleet/kernels/{k}")["replicas"] for k in two_kernels}
    seen = []
    for (pattern, method), decisions in sorted(DECISIONS.items()):
        for target, expected in zip((own, other), decisions, strict=True):
            path = concrete(pattern, target, replicas[target][0]["id"])
            status, body = fleet.request(method, path, BODIES.get(method), token=token)
            seen.append((method, path, status))
            if expected is FORBIDDEN:
                assert status == 403, f"{method} {path}: {status} {body}"
                assert body["reason"] == "forbidden", body
            else:
                assert status not in (401, 403), f"{method} {path}: {status} {body}"
    # and the fleet token still reaches everything the kernel token may not
    assert fleet.request("GET", "/api/fleet/kernels")[0] == 200
    assert len(seen) == 2 * len(DECISIONS)
    # nothing changed: both kernels and their replicas are as they were
    for k in two_kernels:
        assert fleet.api("GET", f"/api/fleet/kernels/{k}")["replicas"] == replicas[k]


def test_the_token_argument_goes_through_the_same_check(token_fleet, two_kernels):
    token = kernel_token(token_fleet, two_kernels[0])
    assert token_fleet.request("GET", f"/api/fleet?token={token}", token="")[0] == 200
    status, body = token_fleet.request("GET", f"/api/fleet/kernels?token={token}", token="")
    assert (status, body["reason"]) == (403, "forbidden")


async def test_a_kernel_token_cannot_open_a_kernels_channels(token_fleet, two_kernels):
    own = two_kernels[0]
    token = kernel_token(token_fleet, own)
    for target in two_kernels:
        request = HTTPRequest(
            token_fleet.ws_url(target), headers={"Authorization": f"token {token}"}
        )
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(request)
        assert refused.value.code == 403
    ws = await token_fleet.connect(own)  # the fleet token does
    ws.close()


def test_a_kernel_token_reads_its_own_events_and_no_others(token_fleet, two_kernels):
    own, other = two_kernels
    token = kernel_token(token_fleet, own)
    status, events = token_fleet.request("GET", "/api/fleet/events?n=1000", token=token)
    assert status == 200
    assert events, "a started kernel has events"
    assert {event["kernel_id"] for event in events} == {own}
    status, body = token_fleet.request("GET", f"/api/fleet/events?kernel={other}", token=token)
    assert (status, body["reason"]) == (403, "forbidden")
    everyone = token_fleet.api("GET", "/api/fleet/events?n=1000")
    assert {own, other} <= {event["kernel_id"] for event in everyone}


def test_a_kernel_reads_and_changes_its_own_gpus_and_not_another_kernels(token_fleet, two_kernels):
    own, other = two_kernels
    token = kernel_token(token_fleet, own)
    status, model = token_fleet.request("GET", f"/api/fleet/kernels/{own}", token=token)
    assert status == 200
    assert (model["id"], model["gpus"]) == (own, 0)
    status, model = token_fleet.request(
        "PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": 1}, token=token
    )
    assert (status, model["gpus"]) == (200, 1), model
    assert token_fleet.api("GET", f"/api/fleet/kernels/{own}")["gpus"] == 1
    status, body = token_fleet.request(
        "PUT", f"/api/fleet/kernels/{other}/gpus", {"gpus": 1}, token=token
    )
    assert (status, body["reason"]) == (403, "forbidden")
    assert token_fleet.api("GET", f"/api/fleet/kernels/{other}")["gpus"] == 0
    for bad in (-1, "1", 1.5, True, None):
        status, body = token_fleet.request(
            "PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": bad}, token=token
        )
        assert (status, body["reason"]) == (400, "invalid-request"), bad
    status, body = token_fleet.request(
        "PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": 5}, token=token
    )
    assert (status, body["reason"]) == (400, "invalid-request")
    assert "the largest host has 1" in body["message"]
    token_fleet.api("PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": 0})


def test_a_kernel_moves_itself_with_its_token(token_fleet, two_kernels):
    fleet = token_fleet
    own = two_kernels[0]
    token = kernel_token(fleet, own)
    path = f"/api/fleet/kernels/{own}/migrate"
    before = fleet.api("GET", f"/api/fleet/kernels/{own}")
    moving = before["replicas"][0]
    used = {replica["host"] for replica in before["replicas"]}
    free = next(h["id"] for h in fleet.api("GET", "/api/fleet/hosts") if h["id"] not in used)
    status, body = fleet.request("POST", path, {"host": "host-99"}, token=token)
    assert (status, body["reason"]) == (404, "not-found")
    assert "host-99" in body["message"]
    status, body = fleet.request("POST", path, {"host": moving["host"]}, token=token)
    assert (status, body["reason"]) == (409, "conflict"), body
    other_host = next(h for h in used if h != moving["host"])
    status, body = fleet.request("POST", path, {"host": other_host}, token=token)
    assert (status, body["reason"]) == (409, "conflict"), body
    status, body = fleet.request("POST", path, {"host": free}, token=token)
    assert status == 200, body
    assert (body["from_host"], body["to_host"]) == (moving["host"], free)
    after = fleet.api("GET", f"/api/fleet/kernels/{own}")
    assert body["replica_id"] in {r["id"] for r in after["replicas"]}
    assert moving["id"] not in {r["id"] for r in after["replicas"]}
    assert free in {r["host"] for r in after["replicas"]}


def test_a_forged_token_is_refused_and_logged(token_fleet, two_kernels):
    fleet = token_fleet
    real = kernel_token(fleet, two_kernels[0])
    forged = real[:-4] + ("0000" if not real.endswith("0000") else "1111")
    for token in (forged, KernelTokens("some-other-fleet-token").issue(two_kernels[0])):
        status, body = fleet.request("GET", "/api/fleet", token=token)
        assert (status, body["reason"]) == (401, "unauthorized"), body
    wait_for(lambda: "refused a forged kernel token" in fleet.log(), 10, "the warning")
    assert re.search(r"WARNING .*refused a forged kernel token", fleet.log())
    warnings = [line for line in fleet.log().splitlines() if "kernel token" in line]
    assert not [line for line in warnings if real in line or forged in line], "no token logged"


def test_the_token_of_a_kernel_gone_is_refused_and_logged(token_fleet):
    fleet = token_fleet
    kernel_id = fleet.start_kernel()
    token = kernel_token(fleet, kernel_id)
    assert fleet.request("GET", "/api/fleet", token=token)[0] == 200
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    status, body = fleet.request("GET", "/api/fleet", token=token)
    assert (status, body["reason"]) == (401, "unauthorized"), body
    wait_for(lambda: f"kernel {kernel_id}, which no longer exists" in fleet.log(), 10, "the log")


# ---- live: the token inside a real replica -------------------------------------------------

ENV_CELL = """
import json, os
print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("KERNELFLEET_")}))
"""

URLLIB_CELL = """
import json, os, urllib.error, urllib.request
def status(path):
    request = urllib.request.Request(
        os.environ["KERNELFLEET_GATEWAY_URL"] + path,
        headers={"Authorization": "token " + os.environ["KERNELFLEET_KERNEL_TOKEN"]},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
own = status("/api/fleet/kernels/" + os.environ["KERNELFLEET_KERNEL_ID"])
other = status("/api/fleet/kernels/OTHER_KERNEL")
print(json.dumps({"own": own, "other": other}))
"""


def doc_example() -> str:
    text = (Path(__file__).parents[2] / "docs" / "gateway-contract.md").read_text()
    section = text.split("## Kernel tokens", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def test_a_replica_holds_its_kernel_token_and_the_gateway_url_not_the_fleet_token(
    token_fleet, two_kernels
):
    fleet = token_fleet
    own, other = two_kernels
    client = await fleet.connect(own)
    try:
        result = await client.request("execute_request", {"code": ENV_CELL}, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        env = json.loads(result.stdout)
        assert env["KERNELFLEET_KERNEL_TOKEN"] == kernel_token(fleet, own)
        assert env["KERNELFLEET_GATEWAY_URL"] == fleet.url
        assert "KERNELFLEET_TOKEN" not in env
        assert fleet.token not in json.dumps(env)

        code = URLLIB_CELL.replace("OTHER_KERNEL", other)
        result = await client.request("execute_request", {"code": code}, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        seen = json.loads(result.stdout)
        assert (seen["own"][0], seen["own"][1]["id"]) == (200, own)
        assert (seen["other"][0], seen["other"][1]["reason"]) == (403, "forbidden")

        # the example of docs/gateway-contract.md, as written there
        result = await client.request("execute_request", {"code": doc_example()}, timeout=60)
        assert result.reply["status"] == "ok", result.reply
        replicas = fleet.api("GET", f"/api/fleet/kernels/{own}")["replicas"]
        shown = result.stdout  # a list of replica models, the running one "executing"
        assert all(repr(replica["id"]) in shown for replica in replicas), shown
    finally:
        client.close()


def test_a_restarted_gateway_honours_the_tokens_and_keeps_the_gpu_default(token_fleet, two_kernels):
    """Stateless tokens: the next gateway (same fleet token) derives the same key; the GPU
    default is stored with the kernel."""
    fleet = token_fleet
    own = two_kernels[0]
    token = kernel_token(fleet, own)
    fleet.api("PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": 1})
    fleet.restart_gateway(signal.SIGKILL)
    wait_for(
        lambda: own in [k["id"] for k in fleet.api("GET", "/api/kernels")],
        30,
        "the new gateway to adopt the kernel",
    )
    status, model = fleet.request("GET", f"/api/fleet/kernels/{own}", token=token)
    assert (status, model["gpus"]) == (200, 1), model
    fleet.api("PUT", f"/api/fleet/kernels/{own}/gpus", {"gpus": 0})
