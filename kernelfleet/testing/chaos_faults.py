"""The chaos soak's fleet, its faults and its watch on the admin API (`kernelfleet.testing.chaos`
holds the workload and the verdict; `run_soak` ties them together).

`ChaosFleet` starts a gateway and host agents as real processes (`kernelfleet.testing.Fleet`);
with network cuts among the faults, each agent runs in a network namespace of its own
(`kernelfleet.testing.netns`). The gateway runs with ``stop_kernels_on_exit`` False, as a
gateway that must outlive restarts does.

The faults (`FaultKind`), one at a time, each once the fleet is whole again (every host alive,
every kernel with all the replicas it wants) or `Soak.heal_timeout` s passed:

- ``kill-replica``: SIGKILL one replica process of a random kernel;
- ``kill-agent``: SIGKILL a random host agent, with its replicas (half the time: the machine
  died) or without (the agent alone crashed); it starts again after `Soak.down` s, as a machine
  that comes back;
- ``kill-gateway``: SIGKILL the gateway and start it again at once on the same port and state;
- ``stop-replica``: SIGSTOP one replica for `Soak.stop_for` s, then SIGCONT;
- ``cut-network``: pull both cables (control and Raft) of a random host for `Soak.cut_for` s.

`Watch` polls the admin API every half second: replicas that appear (replacements), the time each
kernel is degraded (the kernel model's ``degraded`` when it has one, else fewer live replicas
than wanted), the time the gateway does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from kernelfleet.testing.chaos import LIVE_REPLICA_STATES
from kernelfleet.testing.deadlines import wait_for
from kernelfleet.testing.fleet import TOKEN, Fleet
from kernelfleet.testing.netns import CONTROL, RAFT, Topology, build_topology, start_host_in
from kernelfleet.testing.processes import descendants, kill_all

log = logging.getLogger("kernelfleet.testing.chaos")


class FaultKind(enum.Enum):
    KILL_REPLICA = "kill-replica"
    KILL_AGENT = "kill-agent"
    KILL_GATEWAY = "kill-gateway"
    STOP_REPLICA = "stop-replica"
    CUT_NETWORK = "cut-network"


@dataclass
class Soak:
    """How the chaos loop behaves (durations in seconds)."""

    kinds: tuple[FaultKind, ...] = tuple(FaultKind)
    interval: float = 15.0
    """From one fault's start to the next one's (longer when a fault lasts or repair waits)."""
    stop_for: float = 10.0
    cut_for: float = 90.0
    down: float = 10.0
    """How long a killed host agent stays down before it starts again."""
    heal_timeout: float = 90.0
    """How long to wait for the fleet to be whole before the next fault is injected anyway."""
    replicas: int = 3
    in_turn: bool = False
    """Take `kinds` in turn (in an order the seed shuffles) rather than at random: a short soak
    then meets every kind."""
    aim: bool = False
    """Aim replica and host faults at kernels' executors (the replicas running their cells),
    rather than at any live replica or host: every such fault then costs a failover."""


@dataclass
class Fault:
    kind: FaultKind
    at: float
    """`time.time()` once injected (the signal sent, the cable pulled; for the gateway, when
    the kill starts)."""
    target: str
    kernels: list[str]
    """The kernels it hit (a replica of theirs, or every kernel for the gateway)."""
    executors: list[str] = field(default_factory=list)
    """Those of `kernels` whose executor (the replica that ran their last cell) it hit."""
    ended: float = 0.0
    """When it was undone (a stopped replica resumed, a cable plugged in, an agent back)."""
    waited: float = 0.0
    """Seconds the loop waited for the fleet to be whole before this fault."""
    whole: bool = True
    """Whether the fleet was whole when it was injected."""
    machine: bool = False
    """For ``kill-agent``: its replicas were killed with it (the machine died)."""

    @property
    def label(self) -> str:
        """The kind, and for ``kill-agent`` whether the machine or the agent alone died."""
        if self.kind is FaultKind.KILL_AGENT:
            return f"{self.kind.value} ({'machine' if self.machine else 'agent only'})"
        return self.kind.value

    def model(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "label": self.label,
            "at": self.at,
            "target": self.target,
            "kernels": self.kernels,
            "executor_of": self.executors,
            "lasted_s": round(self.ended - self.at, 3) if self.ended else None,
            "waited_for_whole_s": round(self.waited, 3),
            "fleet_was_whole": self.whole,
        }


@dataclass
class ChaosFleet:
    """A gateway and `hosts` agents, in namespaces when `topology` is set."""

    fleet: Fleet
    host_count: int
    gpus: int
    topology: Topology | None = None
    stopped: set[int] = field(default_factory=set)
    """Pids SIGSTOPped and not yet resumed (resumed by `stop`)."""

    @classmethod
    def start(cls, root: Path, hosts: int = 3, gpus: int = 1, namespaces: bool = False,
              replicas: int = 3) -> ChaosFleet:  # fmt: skip
        """Start the fleet in folder `root`; `namespaces`: each agent in a network namespace
        (`NamespacesUnavailable` if this machine cannot)."""
        topology = build_topology(hosts) if namespaces else None
        ip = topology.gateway_ip if topology is not None else "127.0.0.1"
        fleet = Fleet(state_dir=root / "fleet", token=TOKEN, env={}, ip=ip)
        fleet.state_dir.mkdir(parents=True, exist_ok=True)
        fleet.host_args = ("--HostAgentApp.replica_logs_kept_days=1",)  # what `--keep` keeps
        chaos = cls(fleet, hosts, gpus, topology)
        try:
            fleet.gateway_args = (
                "--replicas",
                str(replicas),
                "--GatewayApp.stop_kernels_on_exit=False",
            )
            fleet.start_gateway(*fleet.gateway_args)
            for i in range(1, hosts + 1):
                chaos.start_host(i)
        except BaseException:
            chaos.stop()
            raise
        return chaos

    def start_host(self, i: int) -> None:
        if self.topology is not None:
            start_host_in(self.fleet, self.topology, i, self.gpus)
        else:
            self.fleet.start_host(f"host-{i}", self.gpus)

    def stop(self) -> None:
        """Stop every process (resuming stopped ones first) and remove the namespaces."""
        kill_all(self.stopped, signal.SIGCONT)
        below: set[int] = set()
        for process in self.fleet.hosts.values():
            below.update(descendants(process.pid))
        self.fleet.stop()
        kill_all(below)  # replicas that outlived their agent
        if self.topology is not None:
            self.topology.destroy()

    # ---- the admin API ---------------------------------------------------------------------

    def snapshot(self) -> Snapshot | None:
        """What the gateway lists now, or None if it does not answer."""
        try:
            lists = [self.fleet.request("GET", path) for path in Snapshot.PATHS]
        except OSError:
            return None
        if any(status != 200 for status, _ in lists):
            return None
        (_, kernels), (_, hosts), (_, jupyter) = lists
        return Snapshot(kernels, hosts, {k["id"] for k in jupyter})

    # ---- faults ----------------------------------------------------------------------------

    def kill_replica(self, replica: dict[str, Any]) -> None:
        os.kill(replica["pid"], signal.SIGKILL)

    def host_address(self, i: int) -> str | None:
        status, hosts = self.fleet.request("GET", "/api/fleet/hosts")
        found = [h for h in hosts if h["id"] == f"host-{i}"] if status == 200 else []
        return str(found[0]["address"]) if found else None

    def restart_host(self, i: int, old_address: str | None) -> None:
        """Start host agent i again and wait until the gateway heard from the new agent (a new
        address: an agent down for less than the heartbeat timeout is still listed alive)."""
        self.start_host(i)

        def heard() -> bool:
            address = self.host_address(i)
            return address is not None and address != old_address

        wait_for(heard, 30, f"the gateway to hear from the new agent of host-{i}")

    def kill_agent(self, i: int, with_replicas: bool) -> None:
        host_id = f"host-{i}"
        if with_replicas:
            self.fleet.signal_host(host_id)
        else:
            process = self.fleet.hosts[host_id]
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart_gateway(self) -> None:
        self.fleet.restart_gateway(signal.SIGKILL)

    def stop_replica(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)

    def resume_replica(self, pid: int) -> None:
        kill_all([pid], signal.SIGCONT)
        self.stopped.discard(pid)

    def cut(self, i: int) -> None:
        assert self.topology is not None
        self.topology.cut(i, (CONTROL, RAFT))

    def heal(self, i: int) -> None:
        assert self.topology is not None
        self.topology.heal(i, (CONTROL, RAFT))


@dataclass
class Snapshot:
    """The gateway's lists at one moment."""

    PATHS: ClassVar = ("/api/fleet/kernels", "/api/fleet/hosts", "/api/kernels")

    kernels: list[dict[str, Any]]
    """The admin API's kernel models (``GET /api/fleet/kernels``)."""
    hosts: list[dict[str, Any]]
    listed: set[str]
    """The kernel ids of ``GET /api/kernels``, the list a Jupyter server polls (it forgets a
    kernel missing from it)."""


def degraded(kernel: dict[str, Any], wanted: int) -> bool:
    """The kernel model's ``degraded`` where it has one (issue 12's contract), else whether
    fewer than `wanted` replicas are live."""
    if "degraded" in kernel:
        return kernel["degraded"] is not None
    return sum(r["state"] in LIVE_REPLICA_STATES for r in kernel["replicas"]) < wanted


@dataclass
class Watch:
    """What the admin API showed over the run (`poll` every half second)."""

    chaos: ChaosFleet
    kernels: list[str]
    wanted: int
    replica_ids: dict[str, set[str]] = field(default_factory=dict)
    degraded_s: dict[str, float] = field(default_factory=dict)
    reasons: set[str] = field(default_factory=set)
    unreachable_s: float = 0.0
    unlisted_s: dict[str, float] = field(default_factory=dict)
    """Seconds each kernel was missing from ``GET /api/kernels`` while the gateway answered."""
    last: Snapshot | None = None
    last_at: float = 0.0
    """`time.time()` when `last` was asked for."""
    initial: int = 0

    async def poll(self, stop: asyncio.Event, every: float = 0.5) -> None:
        before = time.monotonic()
        while not stop.is_set():
            asked = time.time()
            snapshot = await asyncio.to_thread(self.chaos.snapshot)
            now = time.monotonic()
            self.take(snapshot, now - before)
            self.last_at = asked
            before = now
            await asyncio.sleep(every)

    def take(self, snapshot: Snapshot | None, dt: float) -> None:
        """Count `dt` seconds (since the previous poll) as `snapshot` shows them."""
        self.last = snapshot
        if snapshot is None:
            self.unreachable_s += dt
            return
        models = {k["id"]: k for k in snapshot.kernels}
        for kernel_id in self.kernels:
            if kernel_id not in snapshot.listed:
                self.unlisted_s[kernel_id] = self.unlisted_s.get(kernel_id, 0.0) + dt
            model = models.get(kernel_id)
            if model is None:
                continue
            ids = self.replica_ids.setdefault(kernel_id, set())
            ids.update(r["id"] for r in model["replicas"])
            if degraded(model, self.wanted):
                self.degraded_s[kernel_id] = self.degraded_s.get(kernel_id, 0.0) + dt
                if model.get("degraded"):
                    self.reasons.add(str(model["degraded"].get("reason", ""))[:300])

    @property
    def replacements(self) -> int:
        return sum(len(ids) for ids in self.replica_ids.values()) - self.initial

    def whole(self, hosts: int, since: float = 0.0, settled: bool = False) -> bool:
        """Every host alive and every kernel with all the replicas it wants, as the last poll
        showed (False if that poll was asked for before `since`); `settled`: and each kernel
        has all of them live, none starting or catching up (degraded or not)."""
        if self.last is None or self.last_at < since:
            return False
        if settled:
            for kernel in self.last.kernels:
                live = sum(r["state"] in LIVE_REPLICA_STATES for r in kernel["replicas"])
                if kernel["id"] in self.kernels and live < self.wanted:
                    return False
        alive = sum(h["state"] == "alive" for h in self.last.hosts)
        listed = {k["id"]: k for k in self.last.kernels}
        return alive >= hosts and all(
            k in listed and not degraded(listed[k], self.wanted) for k in self.kernels
        )


@dataclass
class ChaosLoop:
    """Injects faults until `stop`; `faults` is the log."""

    chaos: ChaosFleet
    watch: Watch
    soak: Soak
    rng: random.Random
    faults: list[Fault] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        next_at = time.monotonic() + self.soak.interval
        order = list(self.soak.kinds)
        if self.soak.in_turn:
            self.rng.shuffle(order)
        while not stop.is_set():
            if await _wait(stop, next_at - time.monotonic()):
                return
            waited_from, since = time.monotonic(), time.time()
            while not self.watch.whole(self.chaos.host_count, since):
                if time.monotonic() - waited_from > self.soak.heal_timeout:
                    break
                if await _wait(stop, 0.5):
                    return
            started = time.monotonic()
            waited = started - waited_from
            if self.soak.in_turn:
                kind = order[len(self.faults) % len(order)]
            else:
                kind = self.rng.choice(self.soak.kinds)
            fault = await self.inject(kind, stop)
            if fault is not None:
                fault.waited, fault.whole = waited, waited <= self.soak.heal_timeout
            next_at = started + self.soak.interval  # no catching up after a long wait

    async def inject(self, kind: FaultKind, stop: asyncio.Event) -> Fault | None:
        snapshot = self.watch.last
        if snapshot is None and kind is not FaultKind.KILL_GATEWAY:
            self.skipped.append(f"{kind.value}: the gateway did not answer")
            return None
        models = snapshot.kernels if snapshot else []
        kernels = [k for k in models if k["id"] in self.watch.kernels]
        executors = {k["executor"] for k in kernels}
        live = [
            (k["id"], r) for k in kernels for r in k["replicas"]
            if r["state"] in LIVE_REPLICA_STATES and r.get("pid")
        ]  # fmt: skip
        aims = [(k, r) for k, r in live if r["id"] in executors] if self.soak.aim else live
        fault: Fault
        if kind in (FaultKind.KILL_REPLICA, FaultKind.STOP_REPLICA):
            if not aims:
                self.skipped.append(f"{kind.value}: no live replica")
                return None
            kernel_id, replica = self.rng.choice(aims)
            if kind is FaultKind.KILL_REPLICA:
                self.chaos.kill_replica(replica)
            else:
                self.chaos.stop_replica(replica["pid"])
            fault = self._record(kind, f"{replica['id']} on {replica['host']}", [kernel_id])
            fault.executors = [kernel_id] if replica["id"] in executors else []
            if kind is FaultKind.STOP_REPLICA:
                await _wait(stop, self.soak.stop_for)
                self.chaos.resume_replica(replica["pid"])
                fault.ended = time.time()
        elif kind is FaultKind.KILL_GATEWAY:
            fault = self._record(kind, "gateway", list(self.watch.kernels))
            fault.executors = list(fault.kernels)
            await asyncio.to_thread(self.chaos.restart_gateway)
            fault.ended = time.time()
        else:
            if aims and self.soak.aim:
                host_id = self.rng.choice(aims)[1]["host"]
            else:
                host_id = f"host-{self.rng.randint(1, self.chaos.host_count)}"
            i = int(host_id.rsplit("-", 1)[1])
            hit = sorted({kernel_id for kernel_id, r in live if r["host"] == host_id})
            ran = [k for k, r in live if r["host"] == host_id and r["id"] in executors]
            if kind is FaultKind.KILL_AGENT:
                machine = self.rng.random() < 0.5
                target = f"{host_id} ({'with' if machine else 'without'} its replicas)"
                address = await asyncio.to_thread(self.chaos.host_address, i)
                await asyncio.to_thread(self.chaos.kill_agent, i, machine)
                fault = self._record(kind, target, hit)
                fault.executors, fault.machine = sorted(ran), machine
                await _wait(stop, self.soak.down)
                await asyncio.to_thread(self.chaos.restart_host, i, address)
            else:
                self.chaos.cut(i)
                fault = self._record(kind, host_id, hit)
                fault.executors = sorted(ran)
                await _wait(stop, self.soak.cut_for)
                self.chaos.heal(i)
            fault.ended = time.time()
        return fault

    def _record(self, kind: FaultKind, target: str, kernels: list[str]) -> Fault:
        fault = Fault(kind, time.time(), target, kernels)
        log.info("fault %s on %s (kernels %s)", kind.value, target, ", ".join(kernels))
        self.faults.append(fault)
        return fault


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` or until `stop`; whether `stop` is set."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
