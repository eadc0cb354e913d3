"""GatewayApp: the Jupyter gateway API and the fleet admin API, in one tornado process.

The gateway holds the fleet token: it marks itself non-dumpable (`kernelfleet.privileges`), so
no kernel of its user can read the token from its ``/proc/<pid>/environ`` or its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import cast

import tornado.httpserver
import tornado.netutil
import tornado.web
from jupyter_events import EventLogger
from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import FleetError
from kernelfleet.gateway.autoscaler import Autoscaler
from kernelfleet.gateway.demand import LiveDemand
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.gpu_settings import GpuSettingsService
from kernelfleet.gateway.handlers import routes
from kernelfleet.gateway.host_drains import HostDrains
from kernelfleet.gateway.host_provider import LocalProcessHostProvider
from kernelfleet.gateway.hosts import HostRegistry
from kernelfleet.gateway.jobs.service import JobService
from kernelfleet.gateway.jobs.store import JobStore
from kernelfleet.gateway.jobs.tokens import JobTokens
from kernelfleet.gateway.kernel_service import KernelService
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.gateway.kernelspecs import KernelSpecCatalog, container_kernelspecs
from kernelfleet.gateway.loop_lag import probe_loop_lag
from kernelfleet.gateway.membership import GatewayMember
from kernelfleet.gateway.objects_gc import KernelObjectsCollector
from kernelfleet.gateway.records import ReplicationSettings
from kernelfleet.gateway.store import KernelStore, StateUnreadable
from kernelfleet.gateway.tool_workers import KernelServiceCells, ToolWorkerService
from kernelfleet.kernels.objectstore import prepare_shared_root
from kernelfleet.limits import GATEWAY_FILES_PER_KERNEL, raise_open_files_limit
from kernelfleet.privileges import mark_non_dumpable
from kernelfleet.runtime_file import GatewayRuntime, remove_runtime, write_runtime
from kernelfleet.scheduler import AutoscaleConfig, StateSync, load_policy
from kernelfleet.scheduler.arrivals import ArrivalWindow
from kernelfleet.scheduler.demand_model import load_or_warn
from kernelfleet.scheduler.hostkinds import HOST_KINDS, ON_DEMAND, SPOT, spot_replicas_allowed
from kernelfleet.scheduler.policies import cluster_subscription_ratio
from kernelfleet.scheduler.usage import UsageWindow
from kernelfleet.web import log_request, new_token

log = logging.getLogger("kernelfleet.gateway")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
CLOUD_HOST_START_S = 60.0
"""A cloud GPU host's start, from the decision to a host that takes work: what the warm
capacity's lead time assumes unless told (the simulator's ``scale_out_delay_s`` too)."""


class GatewayApp(Application):
    name = "kernelfleet-gateway"
    version = __version__
    description = "The kernelfleet gateway: point JupyterLab at it with --gateway-url."

    aliases = {
        "ip": "GatewayApp.ip",
        "port": "GatewayApp.port",
        "token": "GatewayApp.token",
        "state-dir": "GatewayApp.state_dir",
        "policy": "GatewayApp.policy",
        "replicas": "GatewayApp.replicas",
        "kernel-pool-size": "GatewayApp.kernel_pool_size",
        "kernel-pool-max": "GatewayApp.kernel_pool_max",
        "log-level": "Application.log_level",
        "min-hosts": "GatewayApp.min_hosts",
        "max-hosts": "GatewayApp.max_hosts",
        "group-members": "GatewayApp.group_members",
        "group-address": "GatewayApp.group_address",
        "group-url": "GatewayApp.group_url",
    }
    flags = {
        "autoscale": (
            {"GatewayApp": {"autoscale": True}},
            "Start and stop local host agents as demand asks (see --help-all: autoscale_*).",
        ),
    }

    events: EventBus
    hosts: HostRegistry
    kernels: KernelService
    kernelspecs: KernelSpecCatalog
    jobs: JobService
    autoscaler: Autoscaler | None = None
    member: GatewayMember | None = None

    ip = Unicode(
        "127.0.0.1", config=True, help="Address to listen on (loopback unless configured)."
    )
    port = Int(8765, config=True, help="Port to listen on (0 picks a free one).")
    token = Unicode(
        config=True,
        help="Token every request must present. Default: $KERNELFLEET_TOKEN, else a random one.",
    )
    state_dir = Unicode(
        config=True,
        help=(
            "Gateway state folder (its kernels, the hosts its autoscaler started, and "
            "runtime.json while it runs: url, port, pid); a gateway started again on it resumes "
            "them. Default: $KERNELFLEET_STATE_DIR, else .kernelfleet/gateway."
        ),
    )
    group_members = Unicode(
        config=True,
        help=(
            "A replicated gateway: the Raft addresses (host:port, comma separated, an odd number "
            "of at least 3) of every member of its group, this one's included. The group's "
            "leader serves; the others answer 503 until they lead (docs/deploy.md). Needs "
            "--group-address and an explicit token, the same on every member. Empty: a lone "
            "gateway."
        ),
    )
    group_address = Unicode(
        config=True,
        help="This member's Raft address (host:port), one of --group-members. Default: "
        "$KERNELFLEET_GROUP_ADDRESS.",
    )
    group_url = Unicode(
        config=True,
        help="The URL the other members and the proxy reach this member's API at (what a "
        "standby names as the member that serves). Default: $KERNELFLEET_GROUP_URL, else its "
        "ip and port.",
    )
    policy = Unicode(
        "notebookos", config=True, help="Scheduling policy (entry point in kernelfleet.policies)."
    )
    default_kernel_name = Unicode(
        "python3", config=True, help="Kernelspec used when a request names none."
    )
    allowed_kernelspecs = List(
        Unicode(), config=True, help="Kernelspecs offered (empty: every installed one)."
    )
    allowed_env = List(
        Unicode(),
        config=True,
        help="Variables a kernel-create request may set besides KERNEL_* (others are dropped).",
    )
    launch_timeout = Float(40.0, config=True, help="Seconds a kernel may take to start.")
    kernel_pool_size = Int(
        1,
        config=True,
        help="Replica groups of the default kernelspec kept started, joined and idle (no GPU "
        "held) ahead of kernel starts, which take one and return at once; a start the pool "
        "cannot serve (pool empty, another kernelspec, env beyond KERNEL_*) starts cold. "
        "Each costs its replicas' idle memory. 0: no pool.",
    )
    kernel_pool_max = Int(
        0,
        config=True,
        help="The most groups the warm pool grows to when kernel starts come in bursts: it keeps "
        "as many as the most starts seen within one refill time over the last 10 minutes, "
        "between kernel_pool_size and this. 0 (or anything up to kernel_pool_size): it "
        "keeps kernel_pool_size.",
    )
    replicas = Int(
        3,
        config=True,
        help="Replicas per kernel, on distinct hosts, kept in step by Raft (1: no replication).",
    )
    replicated_kernelspecs = Dict(
        {"python3": "kernelfleet-python3"},
        config=True,
        help="Kernelspecs that replicate, mapped to the hosts' kernelspec of the replica kernel. "
        "Installed container kernelspecs (docs/containers.md) replicate as themselves.",
    )
    gpu_kernelspecs = List(
        Int(),
        [1, 2, 4, 8],
        config=True,
        help="GPU counts offered as kernelspecs beside each replicated one (python3-1gpu: "
        "'Python 3 · 1 GPU', ...): starting one gives the kernel that many GPUs per cell, as "
        "KERNEL_GPUS does. The list clients read holds the counts that fit on the largest host "
        "at that moment; empty: no such kernelspecs.",
    )
    object_store_root = Unicode(
        config=True,
        help="Folder every host reaches, for values too large for the Raft log. "
        "Default: <state_dir>/objects (fine on one machine; use a shared mount across hosts).",
    )
    stop_kernels_on_exit = Bool(
        True,
        config=True,
        help="Shut every kernel down when the gateway stops. False leaves them running: the next "
        "gateway started on the same state dir adopts them (so do crashes).",
    )
    heartbeat_timeout = Float(
        5.0, config=True, help="Seconds without a heartbeat after which a host is marked lost."
    )
    recovery_grace = Float(
        60.0,
        config=True,
        help="After a restart, seconds the gateway waits for the hosts of the kernels it finds "
        "in its state dir to report. Meanwhile those kernels are listed as 'starting' and "
        "websockets to them wait; a replica whose host reports without it, or does not come "
        "back within this time, is known dead (the log says which).",
    )
    check_ledger = Bool(
        config=True,
        help="Check the GPU ledger's invariants after every change to it (costs a full check per "
        "event); a breach is logged at ERROR and counted in kernelfleet_ledger_breaches_total, "
        "and the gateway goes on. Default: $KERNELFLEET_CHECK_LEDGER is 1, else False.",
    )

    ratio_window = Float(
        300.0,
        config=True,
        help="Seconds of the moving window over which demand and busy GPUs are averaged for the "
        "cluster subscription ratio (sampled every usage_sample_interval seconds).",
    )
    usage_sample_interval = Float(5.0, config=True, help="Seconds between usage samples.")
    autoscale = Bool(
        False,
        config=True,
        help="Run the policy's autoscaler: add local host agents (processes with virtual GPUs) "
        "under sustained GPU demand and stop idle ones it added, after moving their replicas.",
    )
    min_hosts = Int(
        0, config=True, help="Fewest alive hosts the autoscaler keeps (0: the replica count)."
    )
    max_hosts = Int(8, config=True, help="Most hosts the autoscaler grows to (0: no limit).")
    autoscale_gpus_per_host = Int(1, config=True, help="Virtual GPUs of each host it adds.")
    autoscale_host_kind = Enum(
        list(HOST_KINDS),
        ON_DEMAND,
        config=True,
        help="The kind of the hosts it adds: 'on-demand', or 'spot' (revocable). Kernels keep "
        "a majority of their replicas on on-demand hosts (docs/economics.md, 'Transient hosts').",
    )
    autoscale_spot_share = Float(
        0.0,
        config=True,
        help="Mix host kinds: each host added is spot while spot hosts stay within this share "
        "of the fleet, on-demand otherwise, as the simulator's spot_share (0: every host is of "
        "autoscale_host_kind, which must then stay on-demand). Only kernels of 3 or more "
        "replicas put one on spot.",
    )
    autoscale_interval = Float(5.0, config=True, help="Seconds between autoscaling rounds.")
    autoscale_patience = Int(
        3, config=True, help="Rounds in a row the policy must ask for a change before it is made."
    )
    autoscale_cooldown = Float(
        30.0, config=True, help="Seconds after adding or removing hosts before the next change."
    )
    autoscale_headroom = Float(
        1.05, config=True, help="Hosts wanted: ceil(demand GPUs * headroom / host size) + buffer."
    )
    autoscale_buffer_hosts = Int(1, config=True, help="Idle hosts kept beyond the demand.")
    autoscale_scale_in_headroom = Float(
        0.0,
        config=True,
        help="Release hosts only above the target under this headroom (0: autoscale_headroom).",
    )
    autoscale_demand_model = Unicode(
        "",
        config=True,
        help="A demand model file ('kernelfleet demand train', docs/economics.md): the "
        "autoscaler adds hosts for the busy GPUs it predicts. Missing, unreadable or trained "
        "for hosts of another size than autoscale_gpus_per_host: a warning, and the reactive "
        "rule.",
    )
    autoscale_scale_in_idle = Float(
        0.0, config=True, help="Seconds a host must hold no committed GPU before it is released."
    )
    autoscale_min_host_lifetime = Float(
        0.0, config=True, help="Seconds a host must be up before it is released."
    )
    autoscale_warm_quantile = Float(
        0.0,
        config=True,
        help="Keep idle the GPUs that the cells arriving within autoscale_warm_lead need, at "
        "this quantile of a Poisson model fed by the cells of the last "
        "autoscale_arrival_window seconds (0: no warm capacity, NotebookOS's formula; "
        "docs/economics.md).",
    )
    autoscale_warm_lead = Float(
        0.0,
        config=True,
        help="Seconds ahead the warm capacity covers: how long a host takes to start and the "
        "rounds before one is added (0: autoscale_patience x autoscale_interval + 60 s, a cloud "
        "host's start as the simulator assumes).",
    )
    autoscale_arrival_window = Float(
        900.0, config=True, help="Seconds of cell arrivals whose rate sizes the warm capacity."
    )
    job_policy = Unicode(
        "max_min_fairness",
        config=True,
        help="The policy that shares idle GPUs among background jobs (entry point in "
        "kernelfleet.job_policies; PUT /api/fleet/jobs/policy changes it, and jobs.json keeps "
        "the change).",
    )
    job_round_s = Float(
        360.0, config=True, help="Seconds of a job scheduling round (Gavel's rounds: 6 min)."
    )
    job_resume_after_s = Float(
        30.0,
        config=True,
        help="Seconds after cells release GPUs that a waiting background job is lent them "
        "(instead of at the next round), so that a burst of cells does not restart it each time.",
    )
    job_stop_grace = Float(
        30.0,
        config=True,
        help="Seconds a background job gets to checkpoint and exit after SIGTERM (when a cell "
        "takes its GPUs, or the scheduler moves it) before it is killed.",
    )
    validate_events = Bool(
        config=True,
        help="Check every fleet event against its jupyter_events schema as it is published "
        "(about 60 us each, several per cell); a mismatch is logged at ERROR. Events emitted "
        "through configured EventLogger.handlers are validated by jupyter_events in any case. "
        "Default: $KERNELFLEET_VALIDATE_EVENTS is 1, else False.",
    )

    @default("log_level")
    def _default_log_level(self) -> int:
        return logging.INFO

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("KERNELFLEET_TOKEN") or new_token()

    @default("group_address")
    def _default_group_address(self) -> str:
        return os.environ.get("KERNELFLEET_GROUP_ADDRESS", "")

    @default("group_url")
    def _default_group_url(self) -> str:
        return os.environ.get("KERNELFLEET_GROUP_URL", "")

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.environ.get("KERNELFLEET_STATE_DIR") or os.path.join(".kernelfleet", "gateway")

    @validate("token")
    def _check_token(self, proposal: dict) -> str:
        if len(proposal["value"]) < 8:
            raise TraitError("the token must be at least 8 characters long")
        return proposal["value"]

    @default("check_ledger")
    def _default_check_ledger(self) -> bool:
        return os.environ.get("KERNELFLEET_CHECK_LEDGER", "") == "1"

    @default("validate_events")
    def _default_validate_events(self) -> bool:
        return os.environ.get("KERNELFLEET_VALIDATE_EVENTS", "") == "1"

    @default("object_store_root")
    def _default_object_store_root(self) -> str:
        return os.path.join(os.path.abspath(self.state_dir), "objects")

    @validate("replicas")
    def _check_replicas(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise TraitError("a kernel needs at least 1 replica")
        return proposal["value"]

    @validate("kernel_pool_max")
    def _check_pool_max(self, proposal: dict) -> int:
        if proposal["value"] < 0:
            raise TraitError(
                f"kernel_pool_max must be >= 0 (0: no growth), not {proposal['value']}"
            )
        return proposal["value"]

    @validate("kernel_pool_size")
    def _check_pool_size(self, proposal: dict) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"kernel_pool_size must be >= 0 (0: no pool), not {proposal['value']}")
        return proposal["value"]

    @validate("gpu_kernelspecs")
    def _check_gpu_kernelspecs(self, proposal: dict) -> list[int]:
        counts = list(proposal["value"])
        if any(count < 1 for count in counts):
            raise TraitError(f"gpu_kernelspecs must be positive GPU counts, not {counts}")
        return sorted(set(counts))

    @validate(
        "ratio_window",
        "usage_sample_interval",
        "autoscale_interval",
        "job_round_s",
        "job_resume_after_s",
        "autoscale_arrival_window",
    )
    def _check_positive(self, proposal: dict) -> float:
        if proposal["value"] <= 0:
            raise TraitError(f"{proposal['trait'].name} must be > 0, not {proposal['value']}")
        return proposal["value"]

    @validate("autoscale_spot_share")
    def _check_share(self, proposal: dict) -> float:
        if not 0 <= proposal["value"] <= 1:
            raise TraitError(f"autoscale_spot_share must be within [0, 1], not {proposal['value']}")
        return proposal["value"]

    @validate("port")
    def _check_port(self, proposal: dict) -> int:
        if not 0 <= proposal["value"] <= 65535:
            raise TraitError(f"port {proposal['value']} is out of range")
        return proposal["value"]

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        mark_non_dumpable()
        self.init_logging()
        self.init_open_files()
        self.init_state_dir()
        if self.group_members:
            self.init_member()
            return  # the rest once this member serves (`serve_as_member`)
        self.init_serving()

    def init_serving(self) -> None:
        """The services and the web application, from the state folder as it is now."""
        self.init_services()
        self.init_kernels()
        self.init_jobs()
        self.init_webapp()

    def init_member(self) -> None:
        """Join the gateway group (`kernelfleet.gateway.membership`); exit 2 naming what is
        wrong with the group's settings."""
        members = [member.strip() for member in self.group_members.split(",") if member.strip()]
        if "KERNELFLEET_TOKEN" not in os.environ and "token" not in self.config.GatewayApp:
            self.log.critical("a gateway group needs the same token on every member: --token")
            self.exit(2)
        if "stop_kernels_on_exit" not in self.config.GatewayApp:
            self.stop_kernels_on_exit = False  # another member serves them next
        if not self.group_url and self.ip in ("", "0.0.0.0", "::"):
            log.warning(
                "--group-url is not set and --ip is a wildcard: the other members will name "
                "this one by a loopback URL; give the URL they and the proxy reach it at"
            )
        if "object_store_root" not in self.config.GatewayApp:
            log.warning(
                "every member of a gateway group needs the same object store root "
                "(--GatewayApp.object_store_root, a shared mount): this one uses %s",
                self.object_store_root,
            )
        try:
            self.member = GatewayMember(
                self.group_address,
                members,
                self.group_url,
                self.token,
                Path(self.state_dir),
            )
        except (ValueError, FleetError) as e:
            self.log.critical("cannot join the gateway group: %s", e)
            self.exit(2)

    def init_logging(self) -> None:
        level = cast(int, self.log_level)
        logging.basicConfig(level=level, format=LOG_FORMAT)
        logging.getLogger("kernelfleet").setLevel(level)

    def init_open_files(self) -> None:
        """Raise the open-files limit: each kernel holds some of the gateway's descriptors
        (`kernelfleet.limits`)."""
        limit = raise_open_files_limit()
        if limit is not None:
            holds = limit.after // GATEWAY_FILES_PER_KERNEL
            limit.log(log, f"the gateway holds about {holds} kernels of 3 replicas")

    def init_state_dir(self) -> None:
        """The state folder (0711: kernels reach the object store and autoscaled hosts' folders
        in it, but list nothing; kernels.json is 0600) and the object store root, where each
        kernel's user creates a private folder of its own."""
        state = Path(self.state_dir)
        created = not state.exists()
        state.mkdir(parents=True, exist_ok=True)
        if created:
            state.chmod(0o711)
        try:
            prepare_shared_root(self.object_store_root)
        except OSError as e:
            log.warning(
                "cannot prepare the object store root %s (%s): kernels of their own users may "
                "fail to store large values",
                self.object_store_root,
                e,
            )

    def init_services(self) -> None:
        try:
            policy = load_policy(self.policy, self.autoscaling())
            in_containers = container_kernelspecs()
            replicated = {**in_containers, **self.replicated_kernelspecs}
            kernelspecs = KernelSpecCatalog(
                self.default_kernel_name,
                set(self.allowed_kernelspecs),
                gpu_bases=replicated,
                gpu_counts=self.gpu_kernelspecs,
                largest_host=self._largest_host_gpus,
            )
        except FleetError as e:
            self.log.critical("%s", e)
            self.exit(2)
        if policy.state_sync is StateSync.ON_CRITICAL_PATH:
            self.log.critical(
                "policy %s starts a fresh container per cell and moves state on the critical "
                "path; the gateway does not run it (only `kernelfleet simulate` does)",
                self.policy,
            )
            self.exit(2)
        if policy.replicas == 1 and self.replicas > 1:
            log.info("policy %s runs one replica per kernel: --replicas ignored", self.policy)
            self.replicas = 1
        self.events = EventBus(EventLogger(parent=self), validate=self.validate_events)
        self.hosts = HostRegistry(self.token, self.heartbeat_timeout, self.events)
        replication = ReplicationSettings(
            replicas=self.replicas,
            launch_names=replicated,
            container_launches=frozenset(in_containers),
            store_root=self.object_store_root,
        )
        # the kernel service listens to the registry's reports from here on
        self.kernels = KernelService(
            self.hosts,
            policy,
            kernelspecs,
            self.launch_timeout,
            set(self.allowed_env),
            replication,
            KernelStore(self.state_dir),
            check_ledger=self.check_ledger,
            usage=UsageWindow.spanning(self.ratio_window, self.usage_sample_interval),
            kernel_tokens=KernelTokens(self.token),
            events=self.events,
            pool_size=self.kernel_pool_size,
            pool_ceiling=self.kernel_pool_max,
            pool_file=Path(self.state_dir) / "pool.json",
        )
        self.kernels.metrics.registry.on_collect(self._collect_gpu_metrics)
        self.gpu_settings = GpuSettingsService(self.kernels, self.hosts)
        self.kernelspecs = kernelspecs

    def init_kernels(self) -> None:
        """List the kernels a previous gateway left (`KernelService.restore`) before the first
        request is answered; exit 2, naming the file, if its state cannot be read."""
        try:
            self.kernels.restore()
        except StateUnreadable as e:
            self.log.critical("%s", e)
            self.exit(2)

    def init_jobs(self) -> None:
        """The jobs service over the kernels' GPU ledger, with the jobs a previous gateway left
        (exit 2, naming the file, if they cannot be read); cells preempt its jobs."""
        try:
            self.jobs = JobService(
                self.hosts,
                self.kernels.ledger,
                JobStore(self.state_dir),
                JobTokens(self.token),
                policy=self.job_policy,
                round_s=self.job_round_s,
                grace=self.job_stop_grace,
                checkpoint_root=self.object_store_root,
                relink_grace=self.recovery_grace,
                resume_after_s=self.job_resume_after_s,
            )
            self.jobs.restore()
        except (FleetError, StateUnreadable) as e:
            self.log.critical("%s", e)
            self.exit(2)
        self.kernels.preempt_jobs_with(self.jobs)
        self.tool_workers = ToolWorkerService(
            self.hosts,
            self.kernels.ledger,
            KernelServiceCells(self.kernels, self.kernels.ledger),
            self.jobs,
        )

    def _largest_host_gpus(self) -> int:
        """GPUs of the largest host a cell could run on now, or that the autoscaler could add."""
        return self.kernels.snapshot().host_size

    def autoscaling(self) -> AutoscaleConfig:
        """The policy's autoscaling parameters, from this app's settings."""
        return AutoscaleConfig(
            headroom=self.autoscale_headroom,
            buffer_hosts=self.autoscale_buffer_hosts,
            scale_in_headroom=self.autoscale_scale_in_headroom,
            scale_in_idle_s=self.autoscale_scale_in_idle,
            min_host_lifetime_s=self.autoscale_min_host_lifetime,
            min_hosts=self.min_hosts or self.replicas,
            max_hosts=self.max_hosts,
            warm_quantile=self.autoscale_warm_quantile,
            warm_lead_s=self.autoscale_warm_lead
            or self.autoscale_patience * self.autoscale_interval + CLOUD_HOST_START_S,
        )

    def init_webapp(self) -> None:
        self.webapp = tornado.web.Application(
            routes(),
            token=self.token,
            kernel_token_check=self.kernels.kernel_of_token,
            kernel_service=self.kernels,
            job_service=self.jobs,
            tool_workers=self.tool_workers,
            gpu_settings=self.gpu_settings,
            host_registry=self.hosts,
            host_drains=HostDrains(self.kernels, self.hosts),
            kernelspecs=self.kernelspecs,
            events=self.events,
            policy=self.policy,
            replicas=self.replicas,
            autoscaling=lambda: None if self.autoscaler is None else self.autoscaler.model(),
            metrics=self.kernels.metrics.registry,
            relink_timeout=self.recovery_grace + self.launch_timeout,
            serving=self._serving,
            websocket_max_message_size=1 << 30,
            log_function=log_request,
        )

    def _serving(self) -> tuple[int, str]:
        """(term, URL) this gateway serves in: its group's term, 0 for a lone gateway."""
        if self.member is None:
            return 0, self.local_url()
        return self.member.term, self.member.url

    def _collect_gpu_metrics(self) -> None:
        """Set the GPU gauges from the ledger and the usage window, just before /metrics
        renders; the ratio is the one the policy sees."""
        metrics, totals = self.kernels.metrics, self.kernels.ledger.totals()
        metrics.total_gpus.set(totals.total)
        metrics.committed_gpus.set(totals.committed)
        metrics.busy_gpus.set(self.kernels.usage.busy)
        metrics.demand_gpus.set(self.kernels.usage.demand)
        metrics.subscription_ratio.set(cluster_subscription_ratio(self.kernels.snapshot()))

    async def serve(self) -> None:
        """Listen, watch host liveness, and stop cleanly on SIGINT/SIGTERM."""
        server = tornado.httpserver.HTTPServer(self.webapp, max_body_size=64 << 20)
        sockets = tornado.netutil.bind_sockets(self.port, self.ip)
        self.port = sockets[0].getsockname()[1]
        provider = self._adopting_host_provider() if self.autoscale else None
        if self.autoscale_demand_model and not self.autoscale:
            log.warning("autoscale_demand_model is not used: the autoscaler runs with --autoscale")
        server.add_sockets(sockets)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        log.info("gateway listening on http://%s:%d (policy %s)", self.ip, self.port, self.policy)
        write_runtime(self.state_dir, GatewayRuntime(self.local_url(), self.port, os.getpid()))
        watcher = asyncio.create_task(
            self.hosts.watch_liveness(max(0.2, self.heartbeat_timeout / 5), stop)
        )
        sampler = asyncio.create_task(self._sample_usage(stop))
        recovery = asyncio.create_task(self.kernels.recover(grace=self.recovery_grace))
        objects_gc = asyncio.create_task(self._objects_collector().run())
        job_rounds = asyncio.create_task(self.jobs.run(stop))
        tool_workers = asyncio.create_task(self.tool_workers.run(stop))
        pool = asyncio.create_task(self.kernels.pool.run())
        loop_lag = asyncio.create_task(probe_loop_lag(self.kernels.metrics.loop_lag))
        holding = None if self.member is None else asyncio.create_task(self.member.hold())
        scaling = None
        if provider is not None:
            self.autoscaler = self._autoscaler(provider)
            scaling = asyncio.create_task(self._autoscale(self.autoscaler, stop, recovery))
        await stop.wait()
        log.info("gateway stopping")
        remove_runtime(self.state_dir)
        server.stop()
        watcher.cancel()
        sampler.cancel()
        recovery.cancel()
        objects_gc.cancel()
        job_rounds.cancel()
        tool_workers.cancel()
        pool.cancel()
        loop_lag.cancel()
        if holding is not None:
            holding.cancel()
        if scaling is not None:
            scaling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scaling
        await self.kernels.pool.close()
        await self.kernels.stopped()  # kernels shut down before: their replicas' stops end
        if self.stop_kernels_on_exit:
            await self.kernels.shutdown_all()
        else:
            self.kernels.close()
        if self.autoscaler is not None:
            await self.autoscaler.provider.close()
        self.hosts.close()

    def _objects_collector(self) -> KernelObjectsCollector:
        """Removes the object-store folders of kernels that are gone (gateway.objects_gc)."""
        return KernelObjectsCollector(
            self.object_store_root,
            lambda: [*(kernel.id for kernel in self.kernels.all()), *self.kernels.pool.ids()],
            KernelStore(self.state_dir).path,
            self.events,
        )

    def local_url(self) -> str:
        """The URL a process on this machine reaches the gateway at (loopback for a wildcard
        ``ip``); known once it listens."""
        address = "127.0.0.1" if self.ip in ("", "0.0.0.0") else self.ip
        if ":" in address:
            address = "[::1]" if address == "::" else f"[{address}]"
        return f"http://{address}:{self.port}"

    def _host_provider(self) -> LocalProcessHostProvider:
        """Local host agents with virtual GPUs, registering with this gateway."""
        return LocalProcessHostProvider(
            self.local_url(),
            self.token,
            Path(self.state_dir, "autoscaled"),
            gpus_per_host=self.autoscale_gpus_per_host,
            max_hosts=self.max_hosts,
            kind=self.autoscale_host_kind,
        )

    def _adopting_host_provider(self) -> LocalProcessHostProvider:
        """The host provider, holding the hosts a previous gateway on this state dir started
        and that still run (it may stop them); exit 2, naming the file, if its record of them
        cannot be read."""
        provider = self._host_provider()
        try:
            adopted = provider.adopt()
        except StateUnreadable as e:
            self.log.critical("%s", e)
            self.exit(2)
        if adopted:
            log.info("autoscaled hosts of the previous gateway kept: %s", ", ".join(adopted))
        return provider

    def _autoscaler(self, provider: LocalProcessHostProvider) -> Autoscaler:
        """The autoscaler over `provider`; from now on policies are told the hosts it is
        adding and the size of those it can add."""
        autoscaling = self.autoscaling()
        log.info(
            "autoscaling between %d and %s hosts, adding hosts of %d GPU(s)",
            autoscaling.min_hosts,
            autoscaling.max_hosts or "any number of",
            provider.gpus_per_host,
        )
        autoscaler = Autoscaler(
            self.kernels.snapshot,
            self.kernels.policy,
            provider,
            self.kernels.drain_host,
            cooldown=self.autoscale_cooldown,
            patience=self.autoscale_patience,
            min_hosts=autoscaling.min_hosts,
            max_hosts=autoscaling.max_hosts,
            metrics=self.kernels.metrics,
            hosts=self.hosts,
            events=self.events,
            demand=self._live_demand(provider.gpus_per_host),
            spot_share=self._spot_share(),
        )
        self.kernels.grow_with(autoscaler, autoscaling.max_hosts)
        if autoscaling.warm_quantile > 0:
            self.kernels.count_arrivals_with(ArrivalWindow(self.autoscale_arrival_window))
            log.info(
                "autoscaling keeps idle the GPUs of the cells arriving within %g s, at the %g "
                "quantile of the last %g s",
                autoscaling.warm_lead_s,
                autoscaling.warm_quantile,
                self.autoscale_arrival_window,
            )
        return autoscaler

    def _spot_share(self) -> float:
        """`autoscale_spot_share`, or 0 (with a warning saying why) where spot hosts would
        take no replica: kernels of fewer than 3 replicas keep every one on on-demand hosts."""
        share = self.autoscale_spot_share
        if share and self.autoscale_host_kind == SPOT:
            self.log.critical(
                "autoscale_spot_share mixes host kinds: autoscale_host_kind must stay %s", ON_DEMAND
            )
            self.exit(2)
        if (
            share
            and spot_replicas_allowed(self.replicas, self.kernels.policy.max_spot_replicas) == 0
        ):
            log.warning(
                "autoscale_spot_share %g is not used: kernels of %d replica(s) keep a majority, "
                "here all of them, on on-demand hosts, so a spot host would run none",
                share,
                self.replicas,
            )
            return 0.0
        return share

    def _live_demand(self, gpus_per_host: int) -> LiveDemand | None:
        """The demand model the autoscaler follows, counting cells from now on; None (with a
        warning naming why, from `load_or_warn`) when none is given or it cannot be used."""
        if not self.autoscale_demand_model:
            return None
        model = load_or_warn(self.autoscale_demand_model, gpus_per_host, log)
        if model is None:
            return None
        demand = LiveDemand(model, self.autoscale_demand_model, lambda: len(self.kernels.all()))
        self.kernels.count_demand_with(demand)
        return demand

    async def _autoscale(
        self, autoscaler: Autoscaler, stop: asyncio.Event, recovery: asyncio.Task[None]
    ) -> None:
        """Autoscaling rounds until `stop`, the first after one heartbeat timeout and once the
        kernels of a previous gateway are re-linked: by then the hosts already running
        (started beside the gateway, or left by a previous one) have registered and their
        replicas are counted, so none is mistaken for missing or idle."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), self.heartbeat_timeout)
        with contextlib.suppress(Exception):
            await asyncio.shield(recovery)
        await autoscaler.run(self.autoscale_interval, stop)

    async def _sample_usage(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.kernels.sample_usage()
            await asyncio.sleep(self.usage_sample_interval)

    async def serve_as_member(self, member: GatewayMember) -> None:
        """Stand by until this member leads its group, then serve from the group's state."""

        def listening(port: int) -> None:
            self.port = port
            member.url = member.url or self.local_url()
            write_runtime(self.state_dir, GatewayRuntime(self.local_url(), port, os.getpid()))

        await member.standby(self.ip, self.port, listening)
        member.serve_from()
        self.init_serving()
        await self.serve()

    def start(self) -> None:
        asyncio.run(self.serve() if self.member is None else self.serve_as_member(self.member))


main = GatewayApp.launch_instance
