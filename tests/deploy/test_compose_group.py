"""deploy/compose.group.yaml, the replicated gateway as containers: valid Compose, every
command line parsed by the real applications, and, under podman-compose, the serving member's
container killed while a kernel holds state: a standby serves and the kernel keeps its state."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.gateway.app import GatewayApp
from kernelfleet.gateway.proxy_app import GatewayProxyApp
from kernelfleet.kernels.agent.app import HostAgentApp
from kernelfleet.testing import KernelWebsocket, wait_for
from tests.containers.conftest import base_image, engine, engine_url  # noqa: F401
from tests.deploy.test_compose_file import compose_validators, interpolated, option, run_config
from tests.deploy.test_compose_up import Project, brought_up, fleet_image  # noqa: F401
from tests.kernels.conftest import REPO_ROOT

GROUP = REPO_ROOT / "deploy" / "compose.group.yaml"
MEMBERS = ("gateway-1", "gateway-2", "gateway-3")
SERVICES = ("gateway", *MEMBERS, "host-1", "host-2", "host-3")


@pytest.fixture(scope="module")
def group() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(interpolated(GROUP.read_text()))
    return loaded


def test_compose_validates_the_group_file(tmp_path: Path) -> None:
    validators = compose_validators()
    if not validators:
        pytest.skip("neither `docker compose` nor docker-compose is installed (.ci/run does)")
    env_file = tmp_path / "fleet.env"
    env_file.write_text("KERNELFLEET_TOKEN=compose-group-test-token\n")
    for validator in validators:
        done = run_config(validator, env_file, GROUP)
        assert done.returncode == 0, done.stderr
        assert set(yaml.safe_load(done.stdout)["services"]) == set(SERVICES)


@pytest.mark.usefixtures("logging_as_it_was")
def test_members_agents_and_proxy_agree_on_every_address(
    group: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = group["services"]
    assert set(services) == set(SERVICES)
    proxy = GatewayProxyApp()
    proxy.parse_command_line(services["gateway"]["command"][2:])
    member_urls = []
    raft_addresses = None
    for name in MEMBERS:
        for variable, value in services[name]["environment"].items():
            monkeypatch.setenv(variable, value)
        member = GatewayApp()
        member.parse_command_line(services[name]["command"][2:])
        assert member.group_address == f"{name}:8800"
        assert member.group_url == f"http://{name}:{option(services[name]['command'], 'port')}"
        members = member.group_members.split(",")
        assert member.group_address in members
        assert raft_addresses in (None, members), "every member names the same group"
        raft_addresses = members
        assert member.object_store_root == "/var/lib/kernelfleet/objects"
        mounts = dict(volume.split(":", 1)[::-1] for volume in services[name]["volumes"])
        assert mounts[member.state_dir] == f"{name}-state", "a state volume of its own"
        member_urls.append(member.group_url)
    assert proxy.members == member_urls, "the proxy fronts every member"
    for name in ("host-1", "host-2", "host-3"):
        for variable, value in services[name]["environment"].items():
            monkeypatch.setenv(variable, value)
        agent = HostAgentApp()
        agent.parse_command_line(services[name]["command"][2:])
        assert agent.gateway_url == "http://gateway:8765", "agents reach the proxy"
    assert services["gateway"]["ports"] == ["8765:8765"]
    code = [line.split("#", 1)[0] for line in GROUP.read_text().splitlines()]
    assert not [line for line in code if "token" in line.lower()]


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_the_serving_members_container_killed_a_standby_serves_the_kernel(
    fleet_image: str,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    project = Project(tmp_path, fleet_image, GROUP, SERVICES, replicas=3)
    with brought_up(project):
        wait_for(lambda: project.alive_hosts() == ["host-1", "host-2", "host-3"], 240, "agents")
        status, kernel = project.call("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, kernel
        first = await execute(project, kernel["id"], "x = 41")
        assert first.reply["status"] == "ok", first.reply

        serving = project.call("GET", "/api/fleet/serving")[1]["member"]
        container = f"{project.name}_{serving.split('//')[1].split(':')[0]}_1"
        killed = await asyncio.create_subprocess_exec("podman", "kill", container)
        assert await killed.wait() == 0, f"podman kill {container}"

        def another_serves() -> bool:
            try:
                status, body = project.call("GET", "/api/fleet/serving")
            except OSError:
                return False
            return status == 200 and body["member"] != serving

        wait_for(another_serves, 60, "a standby to serve")
        wait_for(
            lambda: project.call("GET", f"/api/kernels/{kernel['id']}")[0] == 200,
            60,
            "the kernel, adopted",
        )
        second = await execute(project, kernel["id"], "print(x + 1)")
        assert second.stdout == "42\n", second.reply
        assert project.call("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204


async def execute(project: Project, kernel_id: str, code: str) -> Any:
    """Run `code` on the kernel over a websocket of its own, through the published port."""
    request = HTTPRequest(
        project.url.replace("http", "ws", 1)
        + f"/api/kernels/{kernel_id}/channels?session_id=compose",
        headers={"Authorization": f"token {project.token}"},
    )
    client = KernelWebsocket(await websocket_connect(request))
    try:
        return await client.execute(code, timeout=120)
    finally:
        client.close()
