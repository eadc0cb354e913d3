"""The server extension's panel API, end to end: a real jupyter_server in gateway mode in front
of a live fleet (gateway, host agents, ipykernel replicas)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.testing import Fleet

pytestmark = pytest.mark.timeout(120)


async def start_kernel(jp_fetch) -> str:
    response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    return json.loads(response.body)["id"]


async def error_of(call) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as error:
        await call
    assert error.value.response is not None
    return error.value.code, json.loads(error.value.response.body)


async def test_fleet_shows_the_summary_and_every_host(jp_fetch, fleet: Fleet) -> None:
    body = json.loads((await jp_fetch("kernelfleet", "api", "fleet")).body)
    assert body["fleet"]["policy"] == fleet.api("GET", "/api/fleet")["policy"]
    assert {h["id"] for h in body["hosts"]} == set(fleet.hosts)
    for host in body["hosts"]:
        assert set(host["gpus"]) >= {"total", "subscribed", "committed"}
        assert host["gpus"]["total"] == 2
    assert body["jobs"] == fleet.api("GET", "/api/fleet/jobs")


async def test_a_kernel_of_this_server_shows_its_replicas(jp_fetch, fleet: Fleet) -> None:
    kernel_id = await start_kernel(jp_fetch)
    try:
        model = json.loads((await jp_fetch("kernelfleet", "api", "kernels", kernel_id)).body)
        assert model == fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        assert model["replicas"]
        assert {r["host"] for r in model["replicas"]} <= set(fleet.hosts)
    finally:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")


async def test_another_servers_kernel_is_not_found(jp_fetch, fleet: Fleet) -> None:
    """A kernel on the same gateway that this jupyter_server did not start stays hidden."""
    other = fleet.api("POST", "/api/kernels", {"name": "python3"}, expect=201)["id"]
    try:
        status, error = await error_of(jp_fetch("kernelfleet", "api", "kernels", other))
        assert status == 404
        assert error["reason"] == "not-found"
        assert other in error["message"]
        status, error = await error_of(
            jp_fetch("kernelfleet", "api", "sections", params={"kernel": other})
        )
        assert (status, error["reason"]) == (404, "not-found")
    finally:
        fleet.api("DELETE", f"/api/kernels/{other}", expect=204)


async def test_the_routes_need_jupyter_server_auth(jp_fetch) -> None:
    """Without the server's token: 403 (the gateway's token is of no use here either)."""
    for path in ("fleet", "sections", "kernels/00000000-0000-0000-0000-000000000000"):
        for authorization in ("", "token not-the-server-token"):
            call = jp_fetch("kernelfleet", "api", path, headers={"Authorization": authorization})
            status, _ = await error_of(call)
            assert status == 403, (path, authorization)


SECTION_MODULE = """
from kernelfleet.extension.sections import PanelSection, Section

class Replicas(PanelSection):
    async def render(self, context):
        if context.kernel is None:
            return None
        hosts = ", ".join(r["host"] for r in context.kernel["replicas"])
        return Section("Test tool", [("hosts", hosts), ("policy", context.fleet["policy"])],
                       text="from a test plug-in")

class Broken(PanelSection):
    title = "Broken tool"
    async def render(self, context):
        raise RuntimeError("it broke")
"""


@pytest.fixture
def installed_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution on sys.path that registers two panel sections through entry points."""
    (tmp_path / "kf_test_sections.py").write_text(SECTION_MODULE)
    dist = tmp_path / "kf_test_sections-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kf-test-sections\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent("""
        [kernelfleet.panel_sections]
        a-replicas = kf_test_sections:Replicas
        b-broken = kf_test_sections:Broken
        c-not-a-section = kf_test_sections:Section
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("kf_test_sections", None)


async def test_sections_from_entry_points_render_generically(
    installed_sections, jp_fetch, fleet: Fleet
) -> None:
    kernel_id = await start_kernel(jp_fetch)
    try:
        response = await jp_fetch("kernelfleet", "api", "sections", params={"kernel": kernel_id})
        sections = {s["name"]: s for s in json.loads(response.body)}
        assert set(sections) == {"a-replicas", "b-broken"}  # not a PanelSection: left out
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        assert sections["a-replicas"] == {
            "name": "a-replicas",
            "title": "Test tool",
            "rows": [
                {"label": "hosts", "value": ", ".join(r["host"] for r in model["replicas"])},
                {"label": "policy", "value": fleet.api("GET", "/api/fleet")["policy"]},
            ],
            "text": "from a test plug-in",
            "error": None,
        }
        assert sections["b-broken"]["title"] == "Broken tool"
        assert sections["b-broken"]["error"] == "RuntimeError: it broke"
        # Without a kernel, a section may leave itself out.
        without = json.loads((await jp_fetch("kernelfleet", "api", "sections")).body)
        assert [s["name"] for s in without] == ["b-broken"]
    finally:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
