"""deploy/compose.yaml brought up as docs/deploy.md says, under podman-compose: the fleet image
built with `kernelfleet image build --fleet`, a gateway and two host agents in containers on
the project's network, a replicated kernel started through the gateway's published port, cells
run over its websocket, and the project taken down (always, its volumes too)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from kernelfleet.testing import KernelWebsocket, call_json, free_port, wait_for
from tests.containers.conftest import TIMINGS, base_image, engine, engine_url  # noqa: F401
from tests.kernels.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

COMPOSE = REPO_ROOT / "deploy" / "compose.yaml"
FLEET_IMAGE = "localhost/kernelfleet-test-fleet:session"
SERVICES = ("gateway", "host-1", "host-2")


@pytest.fixture(scope="module")
def fleet_image(engine_url: str, base_image: str) -> str:  # noqa: F811 (fixtures above)
    """The image, made by the guide's command (kept across sessions while its recipe holds)."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelfleet",
            "image",
            "build",
            "--fleet",
            f"--base={base_image}",
            f"--tag={FLEET_IMAGE}",
            f"--engine={engine_url}",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    TIMINGS["fleet image (kernelfleet image build --fleet)"] = time.monotonic() - started
    return FLEET_IMAGE


class Project:
    """A Compose project of `compose_file` under podman-compose, with its own name, token file
    and gateway port, running `services`."""

    def __init__(
        self,
        folder: Path,
        image: str,
        compose_file: Path = COMPOSE,
        services: tuple[str, ...] = SERVICES,
        replicas: int = 2,
    ) -> None:
        self.compose_file = compose_file
        self.services = services
        self.name = f"kftest{os.getpid()}"
        self.token = secrets.token_hex(16)
        env_file = folder / "fleet.env"
        env_file.write_text(f"KERNELFLEET_TOKEN={self.token}\n")
        env_file.chmod(0o600)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
        self.env.update(
            KERNELFLEET_IMAGE=image,
            KERNELFLEET_ENV_FILE=str(env_file),
            KERNELFLEET_PORT=str(self.port),
            KERNELFLEET_REPLICAS=str(replicas),
        )

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman-compose", "-f", str(self.compose_file), "-p", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def logs(self) -> str:
        """Every service's log, for a failure's report."""
        parts = []
        for service in self.services:
            done = subprocess.run(
                ["podman", "logs", "--tail", "40", f"{self.name}_{service}_1"],
                capture_output=True,
                text=True,
            )
            parts.append(f"--- {service}:\n{done.stdout}{done.stderr}")
        return "\n".join(parts)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return call_json(self.url + path, method, self.token, body)

    def alive_hosts(self) -> list[str]:
        try:
            status, hosts = self.call("GET", "/api/fleet/hosts")
        except OSError:
            return []  # the gateway is not listening yet
        return sorted(h["id"] for h in hosts if h["state"] == "alive") if status == 200 else []


@contextlib.contextmanager
def brought_up(project: Project) -> Iterator[Project]:
    """`project` up (its services), and down with its volumes and network whatever happens;
    its services' logs printed if the test fails."""
    if shutil.which("podman-compose") is None:
        pytest.skip("podman-compose is not installed (.ci/run installs it)")
    try:
        up = project.compose("up", "-d", *project.services)
        assert up.returncode == 0, up.stdout + up.stderr
        yield project
    except BaseException:
        print(project.logs())
        raise
    finally:
        down = project.compose("down", "-v", "-t", "10")
        subprocess.run(["podman", "network", "rm", f"{project.name}_fleet"], capture_output=True)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture
def project(fleet_image: str, tmp_path: Path) -> Iterator[Project]:
    with brought_up(Project(tmp_path, fleet_image)) as project:
        yield project


async def test_a_compose_fleet_runs_a_replicated_kernel(project: Project) -> None:
    try:
        wait_for(lambda: project.alive_hosts() == ["host-1", "host-2"], 180, "2 alive agents")
        assert project.call("GET", "/api/fleet/hosts")[0] == 200
        assert call_json(project.url + "/api/fleet/hosts", "GET", "")[0] == 401
        assert call_json(project.url + "/api/fleet/hosts", "GET", "wrong")[0] == 403

        status, kernel = project.call("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, kernel
        status, view = project.call("GET", f"/api/fleet/kernels/{kernel['id']}")
        assert status == 200, view
        # one replica on each agent, each bound to its own container's address
        assert sorted(r["host"] for r in view["replicas"]) == ["host-1", "host-2"]

        ws = await websocket_connect(
            HTTPRequest(
                project.url.replace("http", "ws", 1)
                + f"/api/kernels/{kernel['id']}/channels?session_id=compose",
                headers={"Authorization": f"token {project.token}"},
            )
        )
        client = KernelWebsocket(ws)
        try:
            first = await client.execute("x = 6 * 7", timeout=120)
            assert first.reply["status"] == "ok", first.reply
            second = await client.execute("import os; print(x, os.getuid() != 0)", timeout=120)
            assert second.stdout == "42 True\n", second.reply
        finally:
            client.close()
        assert project.call("DELETE", f"/api/kernels/{kernel['id']}")[0] == 204
    except BaseException:
        print(project.logs())
        raise
