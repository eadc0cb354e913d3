"""deploy/compose.yaml: valid Compose (`docker compose config`, or docker-compose 1.29's, which
checks the Compose schema), and what it must say: every option a real option of the process it
starts, no token in it, state on named volumes, agents that reach the gateway by its service
name and give addresses of their own. No container engine is needed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelfleet.gateway.app import GatewayApp
from kernelfleet.kernels.agent.app import HostAgentApp
from kernelfleet.kernels.agent.containers.app import ImageBuildApp
from tests.kernels.conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
GUIDE = REPO_ROOT / "docs" / "deploy.md"
DEFAULTS = re.compile(r"\$\{(\w+):-([^}]*)\}")
TEST_TOKEN = "compose-test-token"


def interpolated(text: str) -> str:
    """The file as Compose reads it with no variables set: every ``${NAME:-default}`` its
    default (the file uses no other form)."""
    return DEFAULTS.sub(lambda m: m.group(2), text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(interpolated(COMPOSE.read_text()))
    return loaded


def agents(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if s["command"][1] == "host"}


def option(command: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"{command} gives --{name} {len(values)} times"
    return values[0]


def test_every_service_runs_kernelfleet_from_the_fleet_image(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"gateway", "host-1", "host-2", "host-3"}
    for name, service in compose["services"].items():
        assert service["image"] == "localhost/kernelfleet:fleet", name
        assert service["command"][:2] in (["kernelfleet", "gateway"], ["kernelfleet", "host"])
        assert service["init"] is True, f"{name}: kernels' orphans need reaping"
    # the image the guide builds is the one the file names by default
    build = ImageBuildApp()
    build.parse_command_line(["--fleet", "--base=python:3.11-slim", "--tag=x"])
    assert build.fleet
    assert "kernelfleet image build --fleet" in GUIDE.read_text()
    assert "--tag localhost/kernelfleet:fleet" in GUIDE.read_text()


@pytest.mark.usefixtures("logging_as_it_was")
def test_every_option_is_one_the_process_knows(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command line and environment, parsed by the real application: a misspelt option
    or variable would fail here, not at a deployment's start."""
    for service in compose["services"].values():
        for name in list(service.get("environment", {})):
            monkeypatch.delenv(name, raising=False)
    gateway = GatewayApp()
    gateway.parse_command_line(compose["services"]["gateway"]["command"][2:])
    for section, values in gateway.config.items():
        assert section == "GatewayApp"
        for trait in values:
            assert gateway.has_trait(trait), f"GatewayApp has no option {trait}"
    assert gateway.ip == "0.0.0.0"
    assert gateway.stop_kernels_on_exit is False
    assert gateway.object_store_root == "/var/lib/kernelfleet/objects"
    for name, service in agents(compose).items():
        for variable, value in service["environment"].items():
            monkeypatch.setenv(variable, value)
        agent = HostAgentApp()
        agent.parse_command_line(service["command"][2:])
        for section, values in agent.config.items():
            assert section == "HostAgentApp"
            for trait in values:
                assert agent.has_trait(trait), f"HostAgentApp has no option {trait}"
        assert agent.host_id == name
        assert agent.kernel_ip == name  # resolved to the container's address at start
        assert agent.raft_ip == name
        assert agent.advertise_url == f"http://{name}:{option(service['command'], 'port')}"
        for variable in service["environment"]:
            monkeypatch.delenv(variable)


def test_agents_reach_the_gateway_by_its_service_name(compose: dict[str, Any]) -> None:
    gateway_port = option(compose["services"]["gateway"]["command"], "port")
    assert compose["services"]["gateway"]["ports"] == [f"8765:{gateway_port}"]
    for name, service in agents(compose).items():
        assert option(service["command"], "gateway") == f"http://gateway:{gateway_port}", name
        assert service["depends_on"] == ["gateway"]
        assert service["hostname"] == name


def test_no_token_in_the_file_the_image_or_a_command_line(compose: dict[str, Any]) -> None:
    code = [line.split("#", 1)[0] for line in COMPOSE.read_text().splitlines()]
    assert not [line for line in code if "token" in line.lower()]
    for name, service in compose["services"].items():
        assert not any(arg.startswith("--token") for arg in service["command"]), name
        assert "KERNELFLEET_TOKEN" not in service.get("environment", {}), name
        assert service["env_file"] == "fleet.env", name
    assert "deploy/fleet.env" in (REPO_ROOT / ".gitignore").read_text().splitlines()
    example = (DEPLOY / "fleet.env.example").read_text()
    assert re.search(r"^KERNELFLEET_TOKEN=$", example, re.MULTILINE)


def test_state_lives_on_named_volumes(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used: set[str] = set()
    for name, service in compose["services"].items():
        mounts = dict(volume.split(":", 1)[::-1] for volume in service["volumes"])
        used.update(mounts.values())
        state_dir = option(service["command"], "state-dir")
        assert state_dir in mounts, f"{name}: its state dir {state_dir} is on no volume"
        assert mounts["/var/lib/kernelfleet/objects"] == "objects", name
    assert used == declared
    states = [v.split(":")[0] for s in agents(compose).values() for v in s["volumes"]]
    states = [v for v in states if v != "objects"]
    assert len(set(states)) == len(states) == 3, "each agent keeps a state dir of its own"


def compose_validators() -> list[list[str]]:
    found = []
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        found.append([docker, "compose"])
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    return found


def run_config(
    validator: list[str], env_file: Path | None, compose_file: Path = COMPOSE
) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    if env_file is not None:
        env["KERNELFLEET_ENV_FILE"] = str(env_file)
    return subprocess.run(
        [*validator, "-f", str(compose_file), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_compose_validates_the_file(tmp_path: Path) -> None:
    validators = compose_validators()
    if not validators:
        pytest.skip(
            "neither `docker compose` nor docker-compose is installed (.ci/run installs it)"
        )
    env_file = tmp_path / "fleet.env"
    env_file.write_text(f"KERNELFLEET_TOKEN={TEST_TOKEN}\n")
    for validator in validators:
        done = run_config(validator, env_file)
        assert done.returncode == 0, done.stderr
        config = yaml.safe_load(done.stdout)
        for name, service in config["services"].items():
            assert service["environment"]["KERNELFLEET_TOKEN"] == TEST_TOKEN, name
        # without the token's file the project does not start
        missing = run_config(validator, tmp_path / "absent.env")
        assert missing.returncode != 0
        assert "absent.env" in missing.stderr
