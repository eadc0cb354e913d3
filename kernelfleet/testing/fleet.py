"""A fleet for tests: a real gateway and host agents as subprocesses, on ephemeral ports.

The processes start and stop through `kernelfleet.gateway.processes`, as ``kernelfleet up`` and
the autoscaler start them. Readiness comes from the processes' APIs, never from their logs: the
gateway answers its HTTP API on the port it was given; a host agent is up once the gateway lists
it alive. Each process logs to ``<state_dir>/<label>.log`` (appended across restarts).

Host agents started by root run their kernels as users of their own (docs/security.md), which
must reach the fleet's folder: `kernel_reachable_folder` makes one that they can traverse (and
not list). A fleet in a folder they cannot reach (pytest's own are 0700) runs its kernels as the
agents' user, with a warning in the hosts' logs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.gateway.processes import (
    host_agent_args,
    kill_group,
    spawn_kernelfleet,
    terminate,
)
from kernelfleet.runtime_file import GatewayRuntime, read_runtime
from kernelfleet.testing.deadlines import wait_for
from kernelfleet.testing.http import call_json
from kernelfleet.testing.processes import descendants, kill_all
from kernelfleet.testing.websocket import KernelWebsocket

TOKEN = "test-token-0123456789abcdef"


@dataclass
class Fleet:
    """A gateway and its host agents running as subprocesses."""

    state_dir: Path
    token: str
    env: dict[str, str]
    gateway: subprocess.Popen[bytes] | None = None
    hosts: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    gateway_args: tuple[str, ...] = ()
    host_args: tuple[str, ...] = ()
    """Arguments every host agent this fleet starts gets, before those of `start_host`."""
    ip: str = "127.0.0.1"
    """The address the gateway listens on (its ``--ip``); host agents reach it there."""

    def spawn(
        self, label: str, *args: str, launcher: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """``python -m kernelfleet ARGS`` (run by `launcher`, if any) with the fleet's token
        and env, logging to ``<state_dir>/<label>.log``."""
        return spawn_kernelfleet(args, self.log_path(label), self.token, self.env, launcher)

    def start_gateway(self, *args: str, port: int = 0, launcher: Sequence[str] = ()) -> None:
        """Start the gateway (run by `launcher`, if any) on `ip`:`port` (0: the system picks)
        and wait until it listens (its runtime file names it) and its API answers.

        Without a warm pool unless `args` ask for one (``--GatewayApp.kernel_pool_size=N``):
        an idle pooled group would cost every test its processes, and tests that count a
        host's replicas would count it."""
        if not any("kernel_pool_size" in arg or arg == "--kernel-pool-size" for arg in args):
            args = (*args, "--GatewayApp.kernel_pool_size=0")
        state_dir = self.state_dir / "gateway"
        gateway = self.gateway = self.spawn(
            "gateway", "gateway", "--ip", self.ip, "--port", str(port),
            "--state-dir", str(state_dir), *args, launcher=launcher,
        )  # fmt: skip

        def listening() -> bool:
            self.check_running("gateway")
            runtime = read_runtime(state_dir, GatewayRuntime, gateway.pid)
            if runtime is not None:
                self.url = runtime.url
            return runtime is not None

        wait_for(listening, 30, "the gateway's runtime file")
        wait_for(self._gateway_answers, 30, "the gateway to answer")

    def _gateway_answers(self) -> bool:
        self.check_running("gateway")
        try:
            return call_json(self.url + "/api/fleet/hosts", token=self.token, timeout=5)[0] == 200
        except OSError:
            return False

    def start_host(
        self, host_id: str, gpus: int = 2, *args: str, launcher: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """Start a host agent (run by `launcher`, if any) and wait until the gateway lists it
        alive; fails at once, with its log, if it exits first."""
        agent_args = host_agent_args(
            self.url, host_id, gpus, self.state_dir / host_id, *self.host_args, *args
        )
        process = self.spawn(host_id, *agent_args, launcher=launcher)
        self.hosts[host_id] = process

        def registered() -> bool:
            self.check_running(host_id)
            return self.host_state(host_id) == "alive"

        wait_for(registered, 30, f"host {host_id} to register")
        return process

    def check_running(self, label: str) -> None:
        """Fail the test, with the end of its log, if process `label` (``"gateway"`` or a host
        id) has exited."""
        process = self.gateway if label == "gateway" else self.hosts.get(label)
        if process is not None and process.poll() is not None:
            pytest.fail(f"{label} exited with {process.returncode}:\n{self.log(label)[-3000:]}")

    def log_path(self, label: str = "gateway") -> Path:
        return self.state_dir / f"{label}.log"

    def log(self, label: str = "gateway") -> str:
        path = self.log_path(label)
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- the gateway's HTTP API ------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        """Call the gateway; returns (status, parsed JSON body or None). Never raises on 4xx/5xx."""
        return call_json(self.url + path, method, self.token if token is None else token, body)

    def request_text(self, method: str, path: str) -> str:
        """Call the gateway with the token; the body as text (``/metrics``), 200 expected."""
        headers = {"Authorization": f"token {self.token}"}
        request = urllib.request.Request(self.url + path, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(response.read().decode())

    def api(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, payload = self.request(method, path, body)
        assert status == expect, f"{method} {path}: {status} {payload}"
        return payload

    def host_state(self, host_id: str) -> str | None:
        status, payload = self.request("GET", "/api/fleet/hosts")
        states = {h["id"]: h["state"] for h in payload} if status == 200 else {}
        return states.get(host_id)

    def start_kernel(self, name: str = "python3", env: dict[str, str] | None = None) -> str:
        return self.api("POST", "/api/kernels", {"name": name, "env": env or {}}, expect=201)["id"]

    def ws_url(self, kernel_id: str, session_id: str = "test") -> str:
        return (
            self.url.replace("http", "ws", 1)
            + f"/api/kernels/{kernel_id}/channels?session_id={session_id}"
        )

    async def connect(
        self, kernel_id: str, token: str | None = None, subprotocol: str | None = None
    ) -> KernelWebsocket:
        """A websocket kernel client straight to the gateway (no jupyter_server in between)."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        headers = {"Authorization": f"token {self.token if token is None else token}"}
        ws = await websocket_connect(
            HTTPRequest(self.ws_url(kernel_id), headers=headers),
            subprotocols=[subprotocol] if subprotocol else None,
        )
        return KernelWebsocket(ws)

    # ---- processes -------------------------------------------------------------------------

    def restart_gateway(self, signum: int = signal.SIGKILL, *args: str) -> None:
        """Stop the gateway with `signum`, then start a new one on the same port and state."""
        assert self.gateway is not None
        os.killpg(self.gateway.pid, signum)
        self.gateway.wait(20)
        port = int(self.url.rsplit(":", 1)[1])
        self.start_gateway(*self.gateway_args, *args, port=port)

    def signal_host(self, host_id: str, signum: int = signal.SIGKILL) -> None:
        """Signal a host agent and every process under it, its kernels included, as when
        the machine is lost (kernels run in sessions of their own)."""
        agent = self.hosts[host_id].pid
        below = descendants(agent)
        os.killpg(agent, signum)
        kill_all(below, signum)
        self.hosts[host_id].wait(10)

    def stop(self) -> None:
        """SIGTERM the gateway and the hosts, SIGKILL what lingers in their sessions, and the
        host agents the gateway's autoscaler started with what runs under them."""
        started_by_gateway = descendants(self.gateway.pid) if self.gateway is not None else []
        processes = [p for p in (self.gateway, *self.hosts.values()) if p is not None]
        terminate(processes, 10)
        for process in processes:
            kill_group(process)
        kill_all(started_by_gateway)


def kernel_reachable_folder() -> Path:
    """A new folder in the system's temporary folder that users of other kernels may traverse
    (mode 0711), for a fleet whose kernels run as users of their own. Not under pytest's base
    folder: pytest keeps that 0700, and another pytest session resets it while this one runs.
    The caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-fleet-"))
    folder.chmod(0o711)
    return folder


def start_fleet(
    state_dir: Path,
    hosts: int = 3,
    gpus: int = 2,
    env: dict[str, str] | None = None,
    token: str = TOKEN,
    replicas: int | None = 1,
    gateway_args: Sequence[str] = (),
    host_args: Sequence[str] = (),
    gpu_speeds: Sequence[str] = (),
) -> Fleet:
    """A gateway and `hosts` agents (``host-1``...) of `gpus` virtual GPUs each; kernels get
    `replicas` replicas (None: the gateway's default); `gateway_args` go to the gateway,
    `host_args` to every host agent. `gpu_speeds`: the ``--gpu-speed`` of host-1, host-2...
    (``"0.5,1.0"``: one factor per GPU, or one for all; hosts beyond the list: 1.0)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(state_dir=state_dir, token=token, env=env or {})
    try:
        replica_args = () if replicas is None else ("--replicas", str(replicas))
        fleet.gateway_args = (*replica_args, *gateway_args)
        fleet.host_args = tuple(host_args)
        fleet.start_gateway(*fleet.gateway_args)
        for i in range(1, hosts + 1):
            speed = gpu_speeds[i - 1] if i <= len(gpu_speeds) else ""
            fleet.start_host(f"host-{i}", gpus, *(("--gpu-speed", speed) if speed else ()))
    except BaseException:
        fleet.stop()
        raise
    return fleet
