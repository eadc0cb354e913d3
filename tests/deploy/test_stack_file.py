"""deploy/stack.yaml, the Swarm stack (never deployed here: no Swarm): valid Compose, every
command line parsed by the real applications, and the shape docs/deploy.md describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelfleet.gateway.app import GatewayApp
from kernelfleet.gateway.proxy_app import GatewayProxyApp
from kernelfleet.kernels.agent.app import HostAgentApp
from tests.deploy.test_compose_file import compose_validators, interpolated, run_config
from tests.kernels.conftest import REPO_ROOT

STACK = REPO_ROOT / "deploy" / "stack.yaml"
MEMBERS = ("gateway-1", "gateway-2", "gateway-3")


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(interpolated(STACK.read_text()))
    return loaded


def test_compose_validates_the_stack(tmp_path: Path) -> None:
    validators = compose_validators()
    if not validators:
        pytest.skip("neither `docker compose` nor docker-compose is installed (.ci/run does)")
    env_file = tmp_path / "fleet.env"
    env_file.write_text("KERNELFLEET_TOKEN=stack-test-token\n")
    for validator in validators:
        done = run_config(validator, env_file, STACK)
        assert done.returncode == 0, done.stderr


@pytest.mark.usefixtures("logging_as_it_was")
def test_members_proxy_and_agents_parse_and_fit_a_swarm(
    stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = stack["services"]
    assert set(services) == {"gateway", *MEMBERS, "host"}
    proxy = GatewayProxyApp()
    proxy.parse_command_line(services["gateway"]["command"][2:])
    urls = []
    for i, name in enumerate(MEMBERS, start=1):
        service = services[name]
        for variable, value in service["environment"].items():
            monkeypatch.setenv(variable, value)
        member = GatewayApp()
        member.parse_command_line(service["command"][2:])
        assert member.group_address == f"{name}:8800"
        assert member.group_address in member.group_members.split(",")
        urls.append(member.group_url)
        deploy = service["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr", "its name must resolve to its own address"
        assert deploy["placement"]["constraints"] == [f"node.labels.kernelfleet.gateway == {i}"]
    assert proxy.members == urls
    host = services["host"]
    for variable, value in host["environment"].items():
        monkeypatch.setenv(variable, value)
    agent = HostAgentApp()
    agent.parse_command_line(host["command"][2:])
    assert agent.gateway_url == "http://127.0.0.1:8765", "the proxy through the routing mesh"
    assert host["networks"] == ["hostnet"]
    assert stack["networks"]["hostnet"] == {"external": True, "name": "host"}
    assert host["deploy"]["mode"] == "global"
    assert host["deploy"]["placement"]["constraints"] == ["node.labels.gpu == true"]
    code = [line.split("#", 1)[0] for line in STACK.read_text().splitlines()]
    assert not [line for line in code if "token" in line.lower()]
