"""``kernelfleet host``: the host agent, one per GPU host.

It owns the host's GPU inventory and its kernel replicas, serves the host agent API
(``kernelfleet.kernels.agent.handlers``) and registers/heartbeats with the gateway
(``kernelfleet.kernels.agent.heartbeat``). SIGTERM or SIGINT stops the heartbeat, shuts every
replica down within ``shutdown_timeout`` seconds (killing stragglers) and exits 0. If the agent
is killed outright, its kernels still exit: jupyter_client passes ``JPY_PARENT_PID`` and
ipykernel quits when that parent goes away.

Once it listens, the agent writes its runtime file, ``<state_dir>/runtime.json``, a JSON object:

- ``host_id``: its host id;
- ``address``: the URL the gateway reaches it at (``--advertise-url``, else ``http://<ip>:<port>``);
- ``port``: the port its API listens on (the one picked when ``--port`` is 0);
- ``pid``: its process id.

The agent holds the fleet token, so it marks itself non-dumpable (`kernelfleet.privileges`): no
process of its user can read its ``/proc/<pid>/environ`` or its memory. Run as root, it launches
each kernel's replicas as a user of that kernel's own (``--kernel-user``; see docs/security.md).

The file appears whole (written aside, then renamed into place) and is removed as the agent
starts a clean exit. An agent that was killed leaves its file behind: a reader must take a file
whose pid no longer runs for stale, never for a live agent. `kernelfleet.runtime_file` writes
and reads it; the local host provider and the tests wait with it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import secrets
import signal
import socket
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from tornado import netutil, web
from tornado.httpserver import HTTPServer
from traitlets import (
    Bool,
    CaselessStrEnum,
    Enum,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)
from traitlets.config import Application, catch_config_error

from kernelfleet import __version__
from kernelfleet.kernels.agent.cache_broker import SOCKET_NAME as CACHE_BROKER_SOCKET
from kernelfleet.kernels.agent.cache_broker import CacheBroker
from kernelfleet.kernels.agent.containers.engine import Engine, EngineUnavailable
from kernelfleet.kernels.agent.containers.runtime import ContainerRuntime
from kernelfleet.kernels.agent.gpu_control import (
    GpuControl,
    GpuControlFailed,
    NvmlGpuControl,
    VirtualGpuControl,
    parse_virtual_ranges,
)
from kernelfleet.kernels.agent.gpu_settings import GpuSettings
from kernelfleet.kernels.agent.gpus import (
    INVENTORY_KINDS,
    VIRTUAL_GPU_TYPE,
    GpuInventory,
    GpuUnavailable,
    make_inventory,
)
from kernelfleet.kernels.agent.handlers import handlers
from kernelfleet.kernels.agent.heartbeat import GatewayHeartbeat, GatewayLink
from kernelfleet.kernels.agent.jobs import JobTable
from kernelfleet.kernels.agent.kernel_process import KernelUser, choose_isolation
from kernelfleet.kernels.agent.replicas import ID_PATTERN, ReplicaState, ReplicaTable
from kernelfleet.kernels.agent.tool_workers import WorkerTable
from kernelfleet.limits import AGENT_FILES_PER_REPLICA, raise_open_files_limit
from kernelfleet.privileges import mark_non_dumpable
from kernelfleet.runtime_file import AgentRuntime, remove_runtime, write_runtime
from kernelfleet.scheduler.hostkinds import HOST_KINDS, ON_DEMAND
from kernelfleet.web import log_request

PACKAGED_KERNELSPECS = Path(__file__).resolve().parent / "kernelspecs"

HOST_ID_FILE = "host-id"
_WILDCARD_IPS = ("", "0.0.0.0", "::")


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _env_number(name: str, kind: type[int] | type[float], fallback: Any) -> Any:
    value = _env(name)
    if value is None:
        return fallback
    try:
        return kind(value)
    except ValueError:
        raise TraitError(f"environment variable {name}={value!r} is not a valid number") from None


def resolve_ip(name: str, value: str) -> str:
    """`value` if it is an IP address, else the IPv4 address its host name resolves to on this
    machine (``/etc/hosts``, then DNS): replicas bind, and advertise, an address, never a name."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    try:
        return socket.gethostbyname(value)
    except OSError as e:
        raise TraitError(
            f"{name}: {value!r} is neither an IP address nor a host name that resolves here ({e})"
        ) from None


def load_or_create_host_id(state_dir: Path) -> str:
    """The host id stored in ``<state_dir>/host-id``; a new ``host-<8 hex>`` is stored if none."""
    path = state_dir / HOST_ID_FILE
    try:
        host_id = path.read_text().strip()
    except FileNotFoundError:
        host_id = f"host-{secrets.token_hex(4)}"
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(host_id + "\n")
        os.replace(tmp, path)
        return host_id
    if not ID_PATTERN.fullmatch(host_id):
        raise TraitError(f"{path} holds {host_id!r}, which is not a valid host id")
    return host_id


class HostAgentApp(Application):
    """The host agent process: GPU inventory, replica launcher, API server, heartbeat."""

    name = "kernelfleet-host"
    version = __version__
    description = (
        "Run kernel replicas for a kernelfleet gateway on this machine: report its GPUs, "
        "launch, interrupt, restart and stop kernels on the gateway's behalf, heartbeat to it."
    )
    examples = "kernelfleet host --gateway http://gw:8888 --token $KERNELFLEET_TOKEN --gpus 4"

    aliases = {
        **Application.aliases,
        "gateway": "HostAgentApp.gateway_url",
        "token": "HostAgentApp.token",
        "gpus": "HostAgentApp.gpus",
        "gpu-inventory": "HostAgentApp.gpu_inventory",
        "gpu-type": "HostAgentApp.gpu_type",
        "kind": "HostAgentApp.kind",
        "gpu-speed": "HostAgentApp.gpu_speed",
        "state-dir": "HostAgentApp.state_dir",
        "host-id": "HostAgentApp.host_id",
        "ip": "HostAgentApp.ip",
        "port": "HostAgentApp.port",
        "advertise-url": "HostAgentApp.advertise_url",
        "kernel-ip": "HostAgentApp.kernel_ip",
        "raft-ip": "HostAgentApp.raft_ip",
        "root-dir": "HostAgentApp.root_dir",
        "heartbeat-interval": "HostAgentApp.heartbeat_interval",
        "launch-timeout": "HostAgentApp.launch_timeout",
        "kernel-user": "HostAgentApp.kernel_user",
        "container-engine": "HostAgentApp.container_engine",
        "container-mount": "HostAgentApp.container_mounts",
    }

    log_level = Enum(
        (0, 10, 20, 30, 40, 50, "DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"),
        default_value=logging.INFO,
        help="Set the log level by value or name.",
    ).tag(config=True)

    log_format = Unicode(
        "[%(levelname)1.1s %(asctime)s.%(msecs)03d %(name)s] %(message)s",
        help="The logging format template.",
    ).tag(config=True)

    gateway_url = Unicode(
        help="The gateway's base URL (http[s]://host:port) to register and heartbeat with. "
        "Default: $KERNELFLEET_GATEWAY_URL. Empty: serve the API without registering anywhere.",
    ).tag(config=True)

    token = Unicode(
        help="The fleet token: required on every call to this agent and sent to the gateway. "
        "Default: $KERNELFLEET_TOKEN. Start-up fails without one.",
    ).tag(config=True)

    gpus = Integer(
        None,
        allow_none=True,
        help="Offer this many virtual GPUs instead of reading the real ones. "
        "Default: $KERNELFLEET_GPUS; unset means the real GPUs through NVML, or none.",
    ).tag(config=True)

    gpu_inventory = CaselessStrEnum(
        INVENTORY_KINDS,
        default_value="auto",
        help="Where the GPUs come from: 'nvml' (real, required), 'virtual' (the --gpus count) "
        "or 'auto' (virtual if --gpus is set, else NVML if it works, else none).",
    ).tag(config=True)

    gpu_type = Unicode(
        help="The GPU type this host advertises for virtual GPUs (job schedulers group GPUs "
        "by type, so a heterogeneous fleet can run here). Real GPUs advertise their NVML name. "
        "Default: $KERNELFLEET_GPU_TYPE, else 'virtual'.",
    ).tag(config=True)

    kind = Enum(
        HOST_KINDS,
        default_value=ON_DEMAND,
        help="What kind of machine this host is: 'on-demand', or 'spot' (revocable: the "
        "provider may take it back). The gateway keeps a majority of every kernel's replicas "
        "on on-demand hosts, so a revoked spot host costs a replica, never a kernel "
        "(docs/economics.md, 'Transient hosts').",
    ).tag(config=True)

    gpu_speed = Unicode(
        help="The relative speed of the virtual GPUs (--gpus N): one factor for all ('0.8') or "
        "a comma list with one per GPU ('1.0,0.5'); the gateway prefers faster GPUs. Real GPUs "
        "are measured at start instead (a short matmul and copy through torch, clocks and "
        "power through NVML). Default: $KERNELFLEET_GPU_SPEED, else 1.0.",
    ).tag(config=True)

    job_stop_timeout = Float(
        10.0,
        help="Seconds each background job gets to stop (SIGTERM, then SIGKILL) when the agent "
        "exits.",
    ).tag(config=True)

    state_dir = Unicode(
        help="Directory for this agent's state: the host id, its runtime file (runtime.json, "
        "while it runs) and each replica's kernel.log. "
        "Default: $KERNELFLEET_STATE_DIR, else $XDG_STATE_HOME/kernelfleet/host "
        "(~/.local/state/kernelfleet/host). Give each agent on one machine its own.",
    ).tag(config=True)

    host_id = Unicode(
        help="This host's id in the fleet. Default: $KERNELFLEET_HOST_ID, else the id stored in "
        "<state_dir>/host-id, else a new 'host-<8 hex>' stored there.",
    ).tag(config=True)

    ip = Unicode(
        help="The IP address the agent API listens on. "
        "Default: $KERNELFLEET_HOST_IP, else 127.0.0.1.",
    ).tag(config=True)

    port = Integer(
        help="The port the agent API listens on; 0 picks a free one (logged at start-up). "
        "Default: $KERNELFLEET_HOST_PORT, else 0.",
    ).tag(config=True)

    advertise_url = Unicode(
        help="The URL the gateway should use to reach this agent. Default: "
        "$KERNELFLEET_ADVERTISE_URL, else http://<ip>:<port> (the host name for a wildcard ip).",
    ).tag(config=True)

    kernel_ip = Unicode(
        help="The IP address kernel replicas bind their ZMQ sockets to; the gateway connects "
        "there. A host name is resolved to its IPv4 address at start. Default: "
        "$KERNELFLEET_KERNEL_IP, else 127.0.0.1.",
    ).tag(config=True)

    raft_ip = Unicode(
        help="The IP address replicas bind their Raft port to; the other replicas of each "
        "kernel connect there, so it must be reachable from every host but need not be public. "
        "A host name is resolved to its IPv4 address at start. Default: $KERNELFLEET_RAFT_IP, "
        "else the kernel IP.",
    ).tag(config=True)

    root_dir = Unicode(
        help="Working directory of kernels whose request names no existing KERNEL_WORKING_DIR. "
        "Default: the agent's working directory.",
    ).tag(config=True)

    heartbeat_interval = Float(
        help="Seconds between heartbeats to the gateway (a replica state change beats at once). "
        "Default: $KERNELFLEET_HEARTBEAT_INTERVAL, else 1.0.",
    ).tag(config=True)

    link_to_gateway = Bool(
        True,
        help="Keep a websocket open to the gateway once registered, so that it sees this "
        "agent's loss at once (its close, or no answer to the gateway's pings for about 2 s) "
        "rather than after its heartbeat timeout (5 s by default). Off: heartbeats only.",
    ).tag(config=True)

    launch_timeout = Float(
        help="Seconds a kernel may take to answer kernel_info when the request gives no "
        "launch_timeout and no KERNEL_LAUNCH_TIMEOUT. "
        "Default: $KERNELFLEET_LAUNCH_TIMEOUT, else 40.",
    ).tag(config=True)

    kernel_user = CaselessStrEnum(
        [choice.value for choice in KernelUser],
        help="Which OS user kernel replicas run as. 'auto': a user of each kernel's own (a uid "
        "derived from the kernel id, so no notebook reads another's files or the agent's "
        "environment) when the agent runs as root and that user can reach the interpreter, "
        "kernelfleet and the state dir; else the agent's user, with a warning saying why. "
        "'same': the agent's user. Default: $KERNELFLEET_KERNEL_USER, else auto.",
    ).tag(config=True)

    container_engine = Unicode(
        help="The Docker Engine API (Docker, or podman's `podman system service`) that runs the "
        "replicas of container kernelspecs (metadata.kernelfleet.runtime = 'container'), e.g. "
        "unix:///var/run/docker.sock. Empty: this agent runs processes only and refuses "
        "container kernelspecs. Default: $KERNELFLEET_CONTAINER_ENGINE, else empty.",
    ).tag(config=True)

    container_mounts = List(
        Unicode(),
        help="Host folders every replica container mounts at the same path, besides its own "
        "folder and working directory: the gateway's object store root, a shared data folder. "
        "Repeat the option for several. Default: $KERNELFLEET_CONTAINER_MOUNTS (':'-separated).",
    ).tag(config=True)

    replica_stop_timeout = Float(
        3.0,
        help="Seconds a replica gets to shut down cleanly (shutdown request, then SIGTERM) before "
        "it is killed.",
    ).tag(config=True)

    shutdown_timeout = Float(
        5.0,
        help="Seconds the agent spends stopping all replicas when it exits; stragglers are killed.",
    ).tag(config=True)

    replica_poll_interval = Float(
        0.5, help="Seconds between checks that each ready replica's process is still alive."
    ).tag(config=True)

    replica_logs_kept_days = Float(
        0.0,
        help="Days a stopped replica's kernel.log stays in <state_dir>/replicas/<id>/ for "
        "debugging (the rest of its folder is removed once its process is reaped). 0: the "
        "whole folder goes at once.",
    ).tag(config=True)

    virtual_gpu_ranges = Unicode(
        help='Clocks and power limits virtual GPUs accept, as JSON: {"gpu_clock_mhz": [MHz, '
        '...], "mem_clock_mhz": [MHz, ...], "power_limit_w": [min, max]} (a key left out: '
        "an A100's). Default: $KERNELFLEET_VIRTUAL_GPU_RANGES, else an A100's.",
    ).tag(config=True)

    virtual_gpu_settings_permitted = Bool(
        True,
        help="Whether virtual GPUs accept changes of their clocks and power limits; False "
        "refuses them as NVML refuses an agent that is not root (for tests).",
    ).tag(config=True)

    # -- defaults from the environment ------------------------------------------------------

    @default("virtual_gpu_ranges")
    def _virtual_gpu_ranges_default(self) -> str:
        return _env("KERNELFLEET_VIRTUAL_GPU_RANGES") or ""

    @validate("virtual_gpu_ranges")
    def _validate_virtual_gpu_ranges(self, proposal: Any) -> str:
        try:
            parse_virtual_ranges(str(proposal["value"]))
        except ValueError as e:
            raise TraitError(str(e)) from None
        return str(proposal["value"])

    @default("log")
    def _log_default(self) -> logging.Logger:
        return logging.getLogger("kernelfleet.host")

    @default("gateway_url")
    def _gateway_url_default(self) -> str:
        return _env("KERNELFLEET_GATEWAY_URL") or ""

    @default("token")
    def _token_default(self) -> str:
        return _env("KERNELFLEET_TOKEN") or ""

    @default("gpus")
    def _gpus_default(self) -> int | None:
        value: int | None = _env_number("KERNELFLEET_GPUS", int, None)
        return value

    @default("gpu_type")
    def _gpu_type_default(self) -> str:
        return _env("KERNELFLEET_GPU_TYPE") or VIRTUAL_GPU_TYPE

    @default("gpu_speed")
    def _gpu_speed_default(self) -> str:
        return _env("KERNELFLEET_GPU_SPEED") or ""

    @default("state_dir")
    def _state_dir_default(self) -> str:
        explicit = _env("KERNELFLEET_STATE_DIR")
        if explicit:
            return explicit
        base = _env("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return str(Path(base) / "kernelfleet" / "host")

    @default("host_id")
    def _host_id_default(self) -> str:
        return _env("KERNELFLEET_HOST_ID") or ""

    @default("ip")
    def _ip_default(self) -> str:
        return _env("KERNELFLEET_HOST_IP") or "127.0.0.1"

    @default("port")
    def _port_default(self) -> int:
        value: int = _env_number("KERNELFLEET_HOST_PORT", int, 0)
        return value

    @default("advertise_url")
    def _advertise_url_default(self) -> str:
        return _env("KERNELFLEET_ADVERTISE_URL") or ""

    @default("kernel_ip")
    def _kernel_ip_default(self) -> str:
        return _env("KERNELFLEET_KERNEL_IP") or "127.0.0.1"

    @default("raft_ip")
    def _raft_ip_default(self) -> str:
        return _env("KERNELFLEET_RAFT_IP") or self.kernel_ip

    @default("kernel_user")
    def _kernel_user_default(self) -> str:
        return (_env("KERNELFLEET_KERNEL_USER") or KernelUser.AUTO.value).lower()

    @default("container_engine")
    def _container_engine_default(self) -> str:
        return _env("KERNELFLEET_CONTAINER_ENGINE") or ""

    @default("container_mounts")
    def _container_mounts_default(self) -> list[str]:
        return [p for p in (_env("KERNELFLEET_CONTAINER_MOUNTS") or "").split(":") if p]

    @validate("container_mounts")
    def _validate_container_mounts(self, proposal: Any) -> list[str]:
        mounts = [os.path.abspath(str(p)) for p in proposal["value"]]
        for path in mounts:
            if not os.path.isdir(path):
                raise TraitError(f"container_mounts: {path!r} is not a folder on this host")
        return mounts

    @default("root_dir")
    def _root_dir_default(self) -> str:
        return os.getcwd()

    @default("heartbeat_interval")
    def _heartbeat_interval_default(self) -> float:
        value: float = _env_number("KERNELFLEET_HEARTBEAT_INTERVAL", float, 1.0)
        return value

    @default("launch_timeout")
    def _launch_timeout_default(self) -> float:
        value: float = _env_number("KERNELFLEET_LAUNCH_TIMEOUT", float, 40.0)
        return value

    # -- validation -------------------------------------------------------------------------

    @validate("gateway_url", "advertise_url")
    def _validate_url(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip().rstrip("/")
        if value and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", value):
            raise TraitError(f"{proposal['trait'].name} must be an http(s) URL, not {value!r}")
        return value

    @validate("gpus")
    def _validate_gpus(self, proposal: Any) -> int | None:
        value = proposal["value"]
        if value is not None and value < 0:
            raise TraitError(f"gpus must be 0 or more, not {value}")
        return value

    @validate("host_id")
    def _validate_host_id(self, proposal: Any) -> str:
        value = str(proposal["value"])
        if value and not ID_PATTERN.fullmatch(value):
            raise TraitError(f"host_id must match {ID_PATTERN.pattern}, not {value!r}")
        return value

    @validate("port")
    def _validate_port(self, proposal: Any) -> int:
        value = int(proposal["value"])
        if not 0 <= value <= 65535:
            raise TraitError(f"port must be between 0 and 65535, not {value}")
        return value

    @validate(
        "heartbeat_interval",
        "launch_timeout",
        "replica_stop_timeout",
        "shutdown_timeout",
        "replica_poll_interval",
    )
    def _validate_positive(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not value > 0:
            raise TraitError(f"{proposal['trait'].name} must be a positive number of seconds")
        return value

    @validate("root_dir")
    def _validate_root_dir(self, proposal: Any) -> str:
        value = os.path.abspath(os.path.expanduser(str(proposal["value"])))
        if not os.path.isdir(value):
            raise TraitError(f"root_dir {value!r} is not a directory")
        return value

    # -- logging ----------------------------------------------------------------------------

    def get_default_logging_config(self) -> dict[str, Any]:
        config = super().get_default_logging_config()
        config["loggers"] = {
            "kernelfleet": {"level": "DEBUG", "handlers": ["console"], "propagate": False},
            "tornado": {"level": "INFO", "handlers": ["console"], "propagate": False},
            "tornado.access": {"level": "WARNING"},
        }
        return config

    # -- start-up ---------------------------------------------------------------------------

    @catch_config_error
    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        self.init_privileges()
        self.init_token()
        self.init_state_dir()
        self.init_host_id()
        self.init_inventory()
        self.init_gpu_settings()
        self.init_addresses()
        self.init_replicas()
        self.init_webapp()
        self.init_heartbeat()

    def init_privileges(self) -> None:
        """Keep processes of this user (same-user kernels) out of the agent's environment and
        memory, where the fleet token is."""
        if not mark_non_dumpable():
            self.log.info("could not mark the agent non-dumpable (not Linux?)")
        limit = raise_open_files_limit()  # each replica holds some of the agent's descriptors
        if limit is not None:
            holds = limit.after // AGENT_FILES_PER_REPLICA
            limit.log(self.log, f"the agent holds about {holds} replicas")

    def init_token(self) -> None:
        if not self.token:
            raise TraitError(
                "no token: pass --token=<token> or set KERNELFLEET_TOKEN "
                "(the same token the gateway was started with)"
            )

    def init_state_dir(self) -> None:
        self.state_path = Path(self.state_dir).expanduser().resolve()
        try:
            (self.state_path / "replicas").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TraitError(f"cannot create the state directory {self.state_path}: {e}") from e

    def init_host_id(self) -> None:
        """The host's lasting id, and this process's own: a gateway that sees the instance change
        knows that every replica the agent no longer reports died with the previous one."""
        self.instance_id = uuid.uuid4().hex
        if not self.host_id:
            self.host_id = load_or_create_host_id(self.state_path)

    def init_inventory(self) -> None:
        try:
            self.inventory: GpuInventory = make_inventory(
                self.gpu_inventory, self.gpus, self.host_id, self.gpu_type, self.gpu_speed
            )
        except (ValueError, GpuUnavailable) as e:
            raise TraitError(str(e)) from e

    def init_gpu_settings(self) -> None:
        """The control of the GPUs' clocks and power limits (NVML for real GPUs), and a reset
        of what a previous run of the agent left changed (`GpuSettings.restore`)."""
        devices = self.inventory.devices()
        control: GpuControl | None = None
        why = ""
        if self.inventory.kind == "nvml":
            try:
                control = NvmlGpuControl(devices)
            except GpuControlFailed as e:
                why = e.message
                self.log.warning("GPU clocks and power limits cannot be set here: %s", why)
        else:
            control = VirtualGpuControl(
                devices,
                parse_virtual_ranges(self.virtual_gpu_ranges),
                permitted=self.virtual_gpu_settings_permitted,
            )
        self.gpu_settings = GpuSettings(control, self.state_path, self._live_replica_ids, why)
        self.gpu_settings.restore()

    def _live_replica_ids(self) -> set[str]:
        running = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.RESTARTING)
        return {r.id for r in self.replicas.all() if r.state in running}

    def init_addresses(self) -> None:
        """The kernel and Raft addresses as IP addresses: a host name given for either (a
        Compose service's own name, say) is resolved once, here."""
        self.kernel_ip = resolve_ip("kernel_ip", self.kernel_ip)
        self.raft_ip = resolve_ip("raft_ip", self.raft_ip)

    def init_replicas(self) -> None:
        replicas_dir = self.state_path / "replicas"
        self.isolation = choose_isolation(KernelUser(self.kernel_user), replicas_dir)
        if self.isolation.warning:
            self.log.warning("%s", self.isolation.warning)
        else:
            self.log.info("kernel isolation: %s", self.isolation.why)
        if self.isolation.per_kernel:
            replicas_dir.chmod(0o711)  # kernels enter their own folder; nobody lists them
        self.kernel_spec_manager = KernelSpecManager(parent=self)
        # The replicated kernel's spec ships with the package, beside the installed ones.
        self.kernel_spec_manager.kernel_dirs.append(str(PACKAGED_KERNELSPECS))
        self.containers: ContainerRuntime | None = None
        if self.container_engine:
            nvidia = [gpu.uuid for gpu in self.inventory.devices() if not gpu.virtual]
            self.containers = ContainerRuntime(
                Engine(self.container_engine),
                self.host_id,
                self.state_path,
                mounts=list(self.container_mounts),
                gpu_uuids=nvidia if self.inventory.kind == "nvml" else [],
            )
            self.log.info("replica containers run on %s", self.container_engine)
        self.replicas = ReplicaTable(
            state_dir=self.state_path,
            kernel_spec_manager=self.kernel_spec_manager,
            root_dir=Path(self.root_dir),
            kernel_ip=self.kernel_ip,
            raft_ip=self.raft_ip,
            launch_timeout=self.launch_timeout,
            stop_timeout=self.replica_stop_timeout,
            poll_interval=self.replica_poll_interval,
            on_change=self._on_replicas_changed,
            config_parent=self,
            isolation=self.isolation,
            keep_logs_for=max(0.0, self.replica_logs_kept_days) * 86400,
            containers=self.containers,
        )
        self.replicas.remove_stale_folders()
        self.jobs = JobTable(
            self.state_path, self.isolation, self.gateway_url, self._on_replicas_changed
        )
        self.workers = WorkerTable(self.state_path, self.isolation, "", self._on_replicas_changed)
        self.cache_broker = CacheBroker(self.state_path / CACHE_BROKER_SOCKET)

    def start_cache_broker(self) -> None:
        """Serves shared caches for as long as the agent serves (docs/dataload.md)."""
        try:
            self.cache_broker.start()
        except OSError as error:
            self.log.warning("no shared caches on this host: the cache broker cannot listen at "
                             "%s: %s", self.cache_broker.path, error)  # fmt: skip
        else:  # kernels and jobs learn its socket (tool workers run pipeline stages only)
            self.replicas.cache_broker = self.jobs.cache_broker = self.cache_broker.path

    def init_webapp(self) -> None:
        self.web_app = web.Application(
            handlers(),
            token=self.token,
            replicas=self.replicas,
            jobs=self.jobs,
            workers=self.workers,
            gpu_settings=self.gpu_settings,
            host_report=self.host_report,
            log_function=log_request,
        )
        try:
            self.sockets = netutil.bind_sockets(self.port, self.ip)
        except OSError as e:
            raise TraitError(f"cannot listen on {self.ip}:{self.port}: {e}") from e
        self.bound_port = self.sockets[0].getsockname()[1]
        self.address = self.advertise_url or _http_url(self.ip, self.bound_port)

    def init_heartbeat(self) -> None:
        """The heartbeat and, once registered, the link whose close tells the gateway at once
        that this agent is gone (`kernelfleet.kernels.agent.heartbeat`)."""
        self.heartbeat: GatewayHeartbeat | None = None
        self.link: GatewayLink | None = None
        if not self.gateway_url:
            self.log.warning(
                "no gateway URL (--gateway / KERNELFLEET_GATEWAY_URL): not registering"
            )
            return
        self.heartbeat = GatewayHeartbeat(
            self.gateway_url,
            self.token,
            self.host_id,
            report=self.host_report,
            interval=self.heartbeat_interval,
        )
        if self.link_to_gateway:
            self.link = GatewayLink(self.heartbeat, self.token, self.instance_id)

    # -- running ----------------------------------------------------------------------------

    def host_report(self) -> dict[str, Any]:
        """The host model: served at ``GET /api/host`` and sent as every heartbeat's body; an
        agent with a container engine adds ``containers`` (its engine, and whether it answers)."""
        report = {
            "id": self.host_id,
            "instance": self.instance_id,
            "address": self.address,
            "gpus": [gpu.to_dict() for gpu in self.inventory.devices()],
            "gpu_type": self.inventory.gpu_type,
            "kind": self.kind,
            "replicas": self.replicas.models(),
            "jobs": self.jobs.models(),
            "workers": self.workers.models(),
            "isolation": self.isolation.model(),
            "gpu_settings": self.gpu_settings.owners(),
        }
        containers = self.replicas.containers_model()
        if containers is not None:
            report["containers"] = containers
        return report

    def _on_replicas_changed(self) -> None:
        self.gpu_settings.replicas_changed()
        if self.heartbeat is not None:
            self.heartbeat.poke()

    def start(self) -> None:
        asyncio.run(self._serve())
        self.log.info("host agent %s stopped", self.host_id)

    async def _serve(self) -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum, stopping)
        self.start_cache_broker()
        # Before it serves: its first answer and heartbeat list the replicas it adopted.
        try:
            containers = await self.replicas.adopt_containers()
        except EngineUnavailable as e:
            self.log.error("replica containers of the previous agent not adopted: %s", e)
        else:
            if containers:
                self.log.info("replica containers adopted: %s", ", ".join(containers))
        server = HTTPServer(self.web_app)
        server.add_sockets(self.sockets)
        write_runtime(
            self.state_path,
            AgentRuntime(self.host_id, self.address, self.bound_port, os.getpid()),
        )
        self.log.info(
            "host agent %s listening on %s with %d GPU(s); state in %s; gateway %s",
            self.host_id,
            self.address,
            len(self.inventory.devices()),
            self.state_path,
            self.gateway_url or "(none)",
        )
        adopted = self.jobs.adopt()
        if adopted:
            self.log.info("jobs of the previous agent found again: %s", ", ".join(adopted))
        ended = await self.workers.end_leftovers(grace=self.job_stop_timeout)
        if ended:
            self.log.info("tool workers of the previous agent stopped: %s", ", ".join(ended))
        watcher = asyncio.create_task(self.replicas.watch())
        beats = asyncio.create_task(self.heartbeat.run()) if self.heartbeat else None
        linking = asyncio.create_task(self.link.run()) if self.link else None
        try:
            await stopping.wait()
        finally:
            remove_runtime(self.state_path)

        if self.heartbeat is not None:
            self.heartbeat.stop()
        if beats is not None:
            beats.cancel()
        if self.link is not None and linking is not None:
            self.link.stop()
            linking.cancel()
        server.stop()
        watcher.cancel()
        await asyncio.gather(
            self.replicas.stop_all(grace=self.shutdown_timeout),
            self.jobs.stop_all(grace=self.job_stop_timeout),
            self.workers.stop_all(grace=self.job_stop_timeout),
        )
        tasks = [task for task in (beats, linking) if task is not None]
        await asyncio.gather(watcher, *tasks, return_exceptions=True)
        self.cache_broker.stop()
        try:
            await asyncio.wait_for(server.close_all_connections(), timeout=1.0)
        except TimeoutError:
            self.log.debug("some API connections were still open at exit")

    def _on_signal(self, signum: int, stopping: asyncio.Event) -> None:
        if stopping.is_set():
            self.log.warning("%s again: already stopping", signal.Signals(signum).name)
            return
        self.log.info("%s received: stopping replicas and exiting", signal.Signals(signum).name)
        stopping.set()


def _http_url(ip: str, port: int) -> str:
    host = socket.gethostname() if ip in _WILDCARD_IPS else ip
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


main = HostAgentApp.launch_instance

if __name__ == "__main__":
    main()
