"""``kernelfleet up``: a gateway and N host agents on this machine, in the foreground.

Each process runs in its own session with its log in ``<state-dir>/logs/``. The token travels in
the environment, never on a command line (where ``ps`` would show it), and the command marks
itself non-dumpable, as the gateway and the hosts do, so that no kernel of the same user reads
it from ``/proc``. SIGINT or SIGTERM stops the gateway, then the hosts (which stop their
kernels), then kills whatever is left.

The fleet token persists in ``<state-dir>/gateway/token`` (mode 0600): the next ``up`` on the
same state dir reuses it, so JupyterLabs left open keep working across a restart of the fleet.
``--token`` or ``$KERNELFLEET_TOKEN`` override it, and become the stored one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

from traitlets import Bool, Float, Int, TraitError, Unicode, default, validate
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.gateway.processes import (
    host_agent_args,
    kill_group,
    log_tail,
    spawn_kernelfleet,
    terminate,
)
from kernelfleet.privileges import mark_non_dumpable
from kernelfleet.web import new_token

GATEWAY_APP = "GatewayApp"
HOST_AGENT_APP = "HostAgentApp"
"""The configurable classes of ``kernelfleet gateway`` and ``kernelfleet host``: options of
theirs given to ``up`` are passed on."""


class UpApp(Application):
    name = "kernelfleet-up"
    version = __version__
    description = (
        "Start a gateway and N local host agents with virtual GPUs, in the foreground. "
        "Options of the gateway (--GatewayApp.NAME=VALUE, see 'kernelfleet gateway --help-all') "
        "and of the host agents (--HostAgentApp.NAME=VALUE, see 'kernelfleet host --help-all') "
        "are passed on to them as given, after the ones this command sets."
    )

    aliases = {
        "ip": "UpApp.ip",
        "port": "UpApp.port",
        "token": "UpApp.token",
        "hosts": "UpApp.hosts",
        "gpus-per-host": "UpApp.gpus_per_host",
        "gpu-speed": "UpApp.gpu_speed",
        "replicas": "UpApp.replicas",
        "state-dir": "UpApp.state_dir",
        "max-hosts": "UpApp.max_hosts",
    }
    flags = {
        "autoscale": (
            {"UpApp": {"autoscale": True}},
            "Let the gateway add hosts under GPU demand (up to --max-hosts) and stop idle ones.",
        ),
    }

    ip = Unicode("127.0.0.1", config=True, help="Address the gateway listens on.")
    port = Int(8765, config=True, help="Port the gateway listens on.")
    token = Unicode(
        config=True,
        help="Token for every request. Default: $KERNELFLEET_TOKEN, else the one kept in "
        "<state-dir>/gateway/token by the previous run, else a new random one. The token in use "
        "is kept there (mode 0600) for the next run.",
    )
    hosts = Int(3, config=True, help="Number of local host agents.")
    gpus_per_host = Int(2, config=True, help="Virtual GPUs per host agent.")
    gpu_speed = Unicode(
        "",
        config=True,
        help="The relative speed of each host's virtual GPUs, passed to every agent as its "
        "--gpu-speed: one factor for all ('0.8') or one per GPU ('1.0,0.5'). Default: 1.0.",
    )
    replicas = Int(3, config=True, help="Replicas per kernel (at most the number of hosts).")
    autoscale = Bool(
        False,
        config=True,
        help="The gateway adds local host agents (each with --gpus-per-host virtual GPUs) under "
        "sustained GPU demand, and drains and stops idle ones it added; never fewer than --hosts.",
    )
    max_hosts = Int(8, config=True, help="Most hosts when autoscaling.")
    state_dir = Unicode(
        config=True,
        help="Folder for state and logs. Default: $KERNELFLEET_STATE_DIR, else ./.kernelfleet.",
    )
    start_timeout = Float(60.0, config=True, help="Seconds to wait for the platform to answer.")
    stop_timeout = Float(
        5.0, config=True, help="Seconds each stage of shutdown may take before kill."
    )

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("KERNELFLEET_TOKEN") or self._stored_token() or new_token()

    @property
    def token_path(self) -> Path:
        """Where the fleet token is kept between runs: in the gateway's state dir."""
        return Path(self.state_dir, "gateway", "token")

    def _stored_token(self) -> str | None:
        """The token the previous run kept, if any; exit 2 naming the file if it is unusable."""
        try:
            token = self.token_path.read_text().strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            self._refuse(f"cannot read the fleet token in {self.token_path}: {e}")
        if len(token) < 8 or any(c.isspace() for c in token):
            self._refuse(
                f"the fleet token in {self.token_path} is not usable (at least 8 characters, no "
                "spaces): fix it, remove it for a new one, or pass --token"
            )
        return token

    def _refuse(self, why: str) -> NoReturn:
        print(f"kernelfleet up: {why}", file=sys.stderr)
        self.exit(2)
        raise AssertionError("unreachable")  # Application.exit raises SystemExit

    def keep_token(self) -> None:
        """Write the token in use to `token_path` (0600), for the next run. The gateway's
        state dir is made as the gateway makes it (0711) if it is new."""
        folder = self.token_path.parent
        if not folder.exists():
            folder.mkdir(parents=True)
            folder.chmod(0o711)
        temporary = folder / ".token.new"
        temporary.unlink(missing_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")
        os.replace(temporary, self.token_path)

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.environ.get("KERNELFLEET_STATE_DIR") or ".kernelfleet"

    @validate("hosts", "gpus_per_host")
    def _check_counts(self, proposal: dict) -> int:
        if proposal["value"] < (1 if proposal["trait"].name == "hosts" else 0):
            raise TraitError(f"{proposal['trait'].name} cannot be {proposal['value']}")
        return proposal["value"]

    def start(self) -> None:
        mark_non_dumpable()
        self.keep_token()
        stopping = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopping.append(True))
        self.url = f"http://{self.ip}:{self.port}"
        self.logs = Path(self.state_dir, "logs")
        self.labels: dict[subprocess.Popen, str] = {}
        self.logs.mkdir(parents=True, exist_ok=True)
        self.logs.chmod(0o700)  # the hosts' logs quote their kernels' output
        self.gateway = self._spawn(
            "gateway",
            [
                "gateway",
                "--ip",
                self.ip,
                "--port",
                str(self.port),
                "--state-dir",
                f"{self.state_dir}/gateway",
                "--replicas",
                str(min(self.replicas, self.hosts)),
                *self._autoscale_args(),
                *self._passed_on(GATEWAY_APP),
            ],
        )
        self.agents = [
            self._spawn(
                f"host-{i}",
                host_agent_args(
                    self.url,
                    f"host-{i}",
                    self.gpus_per_host,
                    f"{self.state_dir}/host-{i}",
                    *(["--gpu-speed", self.gpu_speed] if self.gpu_speed else []),
                    *self._passed_on(HOST_AGENT_APP),
                ),
            )
            for i in range(1, self.hosts + 1)
        ]
        try:
            self._wait_until_up(stopping)
            print(
                f"kernelfleet is up: {self.url} token={self.token} "
                f"({self.hosts} hosts x {self.gpus_per_host} GPUs{self._scaling_note()}) | "
                "connect with: "
                f"jupyter lab --gateway-url={self.url} --GatewayClient.auth_token={self.token}",
                flush=True,
            )
            while not stopping:
                self._check_children()
                time.sleep(0.2)
        finally:
            self._stop_all()

    def _scaling_note(self) -> str:
        return f", autoscaling up to {max(self.max_hosts, self.hosts)}" if self.autoscale else ""

    def _autoscale_args(self) -> list[str]:
        if not self.autoscale:
            return []
        return [
            "--autoscale",
            f"--min-hosts={self.hosts}",
            f"--max-hosts={max(self.max_hosts, self.hosts)}",
            f"--GatewayApp.autoscale_gpus_per_host={self.gpus_per_host}",
        ]

    def _passed_on(self, section: str) -> list[str]:
        """The ``--SECTION.NAME=VALUE`` options this command was given, as given: traitlets
        keeps those of applications it does not know as their command-line strings."""
        if section not in self.config:
            return []
        return [f"--{section}.{name}={value}" for name, value in self.config[section].items()]

    def _spawn(self, label: str, args: list[str]) -> subprocess.Popen:
        process = spawn_kernelfleet(args, self.logs / f"{label}.log", self.token)
        self.labels[process] = label
        return process

    def _wait_until_up(self, stopping: list[bool]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not stopping:
            self._check_children()
            try:
                self._get("/api/kernelspecs")
                alive = [h for h in self._get("/api/fleet/hosts") if h["state"] == "alive"]
                if len(alive) >= self.hosts:
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                self._fail(f"the platform did not come up within {self.start_timeout:.0f} s")
            time.sleep(0.1)

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read())

    def _check_children(self) -> None:
        for process in [self.gateway, *self.agents]:
            if process.poll() is not None:
                self._fail(f"{self.labels[process]} exited with code {process.returncode}")

    def _fail(self, why: str) -> None:
        print(f"kernelfleet up: {why}; logs in {self.logs}/", file=sys.stderr)
        for log_file in sorted(self.logs.glob("*.log")):
            tail = log_tail(log_file)
            if tail:
                print(f"--- {log_file.name} (last lines)", tail, sep="\n", file=sys.stderr)
        self.exit(1)

    def _stop_all(self) -> None:
        """Gateway first (it stops the kernels through the hosts), then the hosts, then kill."""
        for group in ([self.gateway], self.agents):
            terminate(group, self.stop_timeout)
        for process in [self.gateway, *self.agents]:
            kill_group(process)
