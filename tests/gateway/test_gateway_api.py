"""The gateway's own endpoints, called directly: auth, errors, the admin API."""

import json
import re

import pytest
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet import __version__
from kernelfleet.testing import call_json

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("token", "status"), [("", 401), ("wrong-token-123", 403)])
@pytest.mark.parametrize(
    "path",
    [
        "/api/kernelspecs",
        "/api/kernels",
        "/api/fleet",
        "/api/fleet/hosts",
        "/kernelspecs/python3/logo-64x64.png",
    ],
)
def test_every_endpoint_needs_the_token(fleet, path, token, status):
    got, body = fleet.request("GET", path, token=token)
    assert got == status
    assert set(body) == {"reason", "message"}


@pytest.mark.parametrize(("token", "status"), [("", 401), ("wrong-token-123", 403)])
async def test_websocket_handshake_needs_the_token(fleet, token, status):
    kernel_id = fleet.start_kernel()
    try:
        headers = {"Authorization": f"token {token}"} if token else {}
        with pytest.raises(HTTPClientError) as error:
            await websocket_connect(HTTPRequest(fleet.ws_url(kernel_id), headers=headers))
        assert error.value.code == status
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_token_in_query_argument_is_accepted(fleet):
    status, _ = fleet.request("GET", f"/api/kernelspecs?token={fleet.token}", token="")
    assert status == 200


def test_unknown_ids_are_404_json(fleet):
    for path in [
        "/api/kernels/nope",
        "/api/fleet/kernels/nope",
        "/api/fleet/hosts/nope",
        "/api/nothing",
    ]:
        status, body = fleet.request("GET", path)
        assert status == 404, path
        assert body["reason"] == "not-found"
        assert body["message"]
    status, _ = fleet.request("POST", "/api/kernels/nope/interrupt")
    assert status == 404


def test_unknown_kernelspec_lists_the_valid_names(fleet):
    status, body = fleet.request("POST", "/api/kernels", {"name": "cobol"})
    assert status == 404
    assert "cobol" in body["message"]
    assert "python3" in body["message"]


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"env": {"KERNEL_GPUS": "two"}}, "KERNEL_GPUS"),
        ({"env": {"KERNEL_X": 3}}, "string values"),
        ({"env": "KERNEL_X=1"}, "string values"),
    ],
)
def test_bad_kernel_requests_are_400(fleet, body, complaint):
    status, answer = fleet.request("POST", "/api/kernels", body)
    assert status == 400
    assert complaint in answer["message"]


def test_body_that_is_not_json_is_400(fleet):
    import urllib.request

    request = urllib.request.Request(
        fleet.url + "/api/kernels",
        data=b"{nope",
        method="POST",
        headers={"Authorization": f"token {fleet.token}"},
    )
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == 400
    assert json.loads(error.value.read())["reason"] == "invalid-request"


def test_gpu_need_larger_than_any_host_is_refused_at_once(fleet):
    status, body = fleet.request("POST", "/api/kernels", {"env": {"KERNEL_GPUS": "64"}})
    assert status == 400, "waiting would not help: not a 503, which clients retry"
    assert body["reason"] == "never-fits"
    assert "the largest has 2" in body["message"]


def test_admin_api_shows_hosts_and_kernel_replicas(fleet):
    hosts = fleet.api("GET", "/api/fleet/hosts")
    assert {h["id"] for h in hosts} >= {"host-1", "host-2", "host-3"}
    for host in hosts:
        assert set(host) == {
            "id",
            "address",
            "state",
            "kind",
            "gpus",
            "isolation",
            "drain",
            "containers",
        }
        assert host["containers"] is None  # its agent runs processes only
        assert host["kind"] == "on-demand", "a host agent is on-demand unless told"
        assert host["gpus"]["total"] == 2
        assert re.match(r"http://127\.0\.0\.1:\d+$", host["address"])
        agent = call_json(host["address"] + "/api/host", token=fleet.token)[1]
        assert host["isolation"] == agent["isolation"]  # as the agent says, passed through
        assert host["isolation"]["kernel_user"] in ("per-kernel", "agent")
        assert host["isolation"]["why"]
        assert fleet.api("GET", f"/api/fleet/hosts/{host['id']}")["isolation"] == host["isolation"]

    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    try:
        view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        assert set(view) == {
            "id", "name", "replicas", "executor", "gpus", "gpus_held", "queued_cells",
            "last_activity", "notebook_path", "user", "recent_cells", "waiting", "degraded",
            "started_from_pool",
        }  # fmt: skip
        assert view["started_from_pool"] is False  # this fleet runs no pool
        assert (view["gpus"], view["gpus_held"], view["recent_cells"]) == (1, [], [])
        assert view["waiting"] is None
        assert view["executor"] is None
        (replica,) = view["replicas"]
        assert set(replica) == {"id", "host", "pid", "state"}
        assert replica["pid"] > 0
        host = fleet.api("GET", f"/api/fleet/hosts/{replica['host']}")
        assert host["gpus"]["subscribed"] >= 1
        assert host["gpus"]["committed"] == 0
        assert kernel_id in [k["id"] for k in fleet.api("GET", "/api/fleet/kernels")]
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


FLEET_FIELDS = {
    "version", "policy", "replicas", "hosts", "gpus", "kernels", "jobs", "autoscaling"
}  # fmt: skip


def test_fleet_summary_names_the_policy_and_counts_the_fleet(fleet):
    summary = fleet.api("GET", "/api/fleet")
    assert set(summary) == FLEET_FIELDS
    assert (summary["version"], summary["policy"], summary["replicas"]) == (
        __version__,
        "notebookos",
        1,
    )
    hosts = fleet.api("GET", "/api/fleet/hosts")
    alive = [h for h in hosts if h["state"] == "alive"]
    assert summary["hosts"] == {"alive": len(alive), "lost": len(hosts) - len(alive)}
    assert summary["hosts"]["alive"] >= 3
    assert summary["gpus"]["total"] == 2 * len(alive)

    before = summary["kernels"]
    kernel_id = fleet.start_kernel(env={"KERNEL_GPUS": "1"})
    try:
        summary = fleet.api("GET", "/api/fleet")
        assert summary["kernels"] == before + 1
        assert summary["gpus"]["subscribed"] >= 1
        assert summary["gpus"]["committed"] == 0
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_fleet_summary_reports_the_configured_policy(private_fleet):
    gateway = private_fleet(hosts=0, replicas=2, gateway_args=["--policy", "packing"])
    summary = gateway.api("GET", "/api/fleet")
    assert summary == {
        "version": __version__,
        "policy": "packing",
        "replicas": 2,
        "hosts": {"alive": 0, "lost": 0},
        "gpus": {"total": 0, "subscribed": 0, "committed": 0},
        "kernels": 0,
        "jobs": {"queued": 0, "running": 0, "gpus_lent": 0},
        "autoscaling": None,
    }
