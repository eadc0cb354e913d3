"""Fixtures for the host agent tests: a recording fake gateway and host-agent subprocesses.

``GatewayRecorder`` is a tornado app in the test's event loop that records every heartbeat PUT.
``host_agent(...)`` is a factory: each call starts ``python -m kernelfleet host`` as a real
subprocess on an ephemeral port and returns an ``AgentProcess`` once the agent listens.
``fault_kernelspecs`` installs a kernelspec (``fault``) whose process fails or stalls on command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

import kernelfleet
from kernelfleet.gateway.processes import spawn_kernelfleet
from kernelfleet.kernels.agent.client import HostAgentClient
from kernelfleet.runtime_file import AgentRuntime, pid_alive, read_runtime
from kernelfleet.testing import wait_until

TOKEN = "host-agent-test-token-0123456789"
REPO_ROOT = Path(kernelfleet.__file__).resolve().parent.parent


# ---- the fake gateway ---------------------------------------------------------------------------


@dataclass
class Put:
    path: str
    authorization: str
    body: dict[str, Any]
    at: float


class GatewayRecorder:
    """Answers ``PUT /api/fleet/hosts/{id}`` with 200 and records each one.

    Use as ``async with GatewayRecorder() as gateway:`` inside a test (it serves on the test's
    event loop); ``port`` picks the port, else an ephemeral one.
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.puts: list[Put] = []
        self.server: HTTPServer | None = None
        self.url = ""

    async def __aenter__(self) -> GatewayRecorder:
        recorder = self

        class HostPut(web.RequestHandler):
            def put(self, host_id: str) -> None:
                recorder.puts.append(
                    Put(
                        path=self.request.path,
                        authorization=self.request.headers.get("Authorization", ""),
                        body=json.loads(self.request.body),
                        at=time.monotonic(),
                    )
                )
                self.finish("{}")

        sockets = bind_sockets(self.port, "127.0.0.1")
        self.server = HTTPServer(web.Application([(r"/api/fleet/hosts/([^/]+)", HostPut)]))
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.server is not None:
            self.server.stop()
            await self.server.close_all_connections()
            self.server = None

    async def wait_for_put(
        self, predicate: Callable[[Put], bool] = lambda p: True, within: float = 10.0
    ) -> Put:
        """The first recorded PUT (old or new) that satisfies ``predicate``."""
        return await wait_until(
            lambda: next((p for p in self.puts if predicate(p)), None), within, "a matching PUT"
        )


# ---- host agents --------------------------------------------------------------------------------


@dataclass
class AgentProcess:
    """One ``kernelfleet host`` subprocess and what the test learned about it."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    log_path: Path
    address: str = ""
    kernel_pids: set[int] = field(default_factory=set)
    client: HostAgentClient = field(init=False)

    @property
    def host_id(self) -> str:
        return (self.state_dir / "host-id").read_text().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def wait_exit(self, within: float) -> int:
        await wait_until(lambda: self.process.poll() is not None, within, "the agent to exit")
        return self.process.returncode


@pytest.fixture
def host_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Awaitable[AgentProcess]]]:
    """``await host_agent(gateway_url=..., gpus=2, args=[...], env={...}, state_dir=None)``
    -> AgentProcess.

    A sync fixture handing out an async factory, so it works under any asyncio test runner;
    every agent still running at teardown gets SIGTERM (then SIGKILL), and every kernel pid the
    test recorded in ``kernel_pids`` is killed if it outlived its agent.
    """
    agents: list[AgentProcess] = []

    async def start(
        gateway_url: str | None = None,
        gpus: int | None = 2,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        heartbeat_interval: float = 0.2,
        state_dir: Path | None = None,
    ) -> AgentProcess:
        n = len(agents)
        if state_dir is None:  # else: that of an agent before it, started again
            state_dir = tmp_path / f"agent{n}"
            state_dir.mkdir()
        log_path = tmp_path / f"agent{n}.log"
        argv = ["host", "--state-dir", str(state_dir), "--port", "0"]
        argv += ["--root-dir", str(tmp_path), "--heartbeat-interval", str(heartbeat_interval)]
        if gateway_url:
            argv += ["--gateway", gateway_url]
        if gpus is not None:
            argv += ["--gpus", str(gpus)]
        argv += args or []
        python_path = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        process_env = {"PYTHONPATH": os.pathsep.join(python_path), **(env or {})}
        process = spawn_kernelfleet(argv, log_path, TOKEN, process_env)
        agent = AgentProcess(process=process, state_dir=state_dir, log_path=log_path)
        agents.append(agent)

        def listening() -> str | None:
            if process.poll() is not None:
                pytest.fail(f"the agent exited with {process.returncode}:\n{agent.log()[-3000:]}")
            runtime = read_runtime(state_dir, AgentRuntime, process.pid)
            return runtime.address if runtime else None

        agent.address = await wait_until(listening, 30, "the agent's runtime file")
        agent.client = HostAgentClient(agent.address, TOKEN)
        return agent

    for name in [name for name in os.environ if name.startswith("KERNELFLEET_")]:
        monkeypatch.delenv(name)  # the agents' configuration is the test's alone
    yield start

    for agent in agents:
        if agent.process.poll() is None:
            agent.process.send_signal(signal.SIGTERM)
    for agent in agents:
        try:
            agent.process.wait(15)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait()
        agent.client.close()
        for pid in agent.kernel_pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---- a kernelspec that fails on command ---------------------------------------------------------

FAULT_KERNEL = """
import os, sys, time
switch = os.environ.get("FAULT_SWITCH")
if switch and not os.path.exists(switch):
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[1]])
pid_file = os.environ.get("FAULT_PID_FILE")
if pid_file:
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
if os.environ.get("FAULT_MODE") == "stall":
    time.sleep(120)
sys.stderr.write("boom\\n")
sys.exit(3)
"""


@pytest.fixture
def fault_kernelspecs(tmp_path: Path) -> dict[str, str]:
    """Env for the agent that adds two kernelspecs. ``fault`` writes "boom" to stderr and exits
    3; with ``FAULT_MODE=stall`` in the kernel's env it sleeps without ever answering; with
    ``FAULT_SWITCH=<path>`` it is a real ipykernel while that file does not exist.
    ``missing`` names a program that does not exist."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "fault"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-c", FAULT_KERNEL, "{connection_file}"],
        "display_name": "Fault double",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    missing_dir = tmp_path / "jupyter" / "kernels" / "missing"
    missing_dir.mkdir()
    missing = {"argv": [str(tmp_path / "no-such-program")], "display_name": "Missing"}
    (missing_dir / "kernel.json").write_text(json.dumps(missing))
    return {"JUPYTER_PATH": str(tmp_path / "jupyter")}
