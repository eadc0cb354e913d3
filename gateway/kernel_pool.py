"""A warm pool of replica groups, started ahead of the kernel starts that will take them.

A kernel start pays for its replicas' process launches and, when it replicates, the Raft
join: 1.6-1.8x a local kernel's start. The pool keeps `size` groups of the gateway's default
kernelspec launched, joined and linked, idle and holding no GPU (their replicas subscribe
none), so that a start takes one, binds it, and returns; a background task refills the pool.

**Identity.** A pooled group is launched as a kernel of its own, under a fresh random kernel
id, exactly as a cold start would launch it: its replicas' user (derived from that id), kernel
token (issued for that id), Raft password and ZMQ keys are its own and never change. The start
that takes the group makes that id the kernel's id (the gateway chooses kernel ids; no client
names one). Nothing is rebound, so nothing can leak between kernels: a group is taken by at
most one start (`take` pops it, on the event loop, before any await), the id was never shown
to a client before that, and a taken group never comes back to the pool (its shutdown stops
it). The token of a pooled group is refused until its start put the kernel in the table.
What only the start knows is bound afterwards, with `Request.BIND`: its ``KERNEL_*``
variables and its working directory (`kernelfleet.kernels.replica.start_binding`).

**Which starts it serves** (`unfit` says why not, and the start is then cold): those of the
default kernelspec's launch (its GPU variants included: GPUs are claimed in the gateway's
ledger, at bind time), whose ``env`` holds ``KERNEL_*`` variables only (others are read when a
process starts, so they need a launch), and not under a policy that holds a kernel's GPUs for
its whole life (those are placed with their GPUs). A burst larger than the pool: the first
starts take the groups ready, the rest start cold.

**How many.** At least `size` groups, and up to `ceiling` when starts come in bursts: the
pool keeps as many groups as the most starts it was asked for within one refill time (the
longest of its last few fills) over the last `DEMAND_WINDOW` seconds (`pool_target`), so that a
burst like the largest recent one is served from the pool while it refills. Groups beyond the
target once a burst is forgotten are stopped, newest first. `ceiling` equal to `size` (the
default) keeps the pool at `size`.

**Keeping it full.** A group whose replica died, or whose host is lost or draining, is stopped
and replaced without any start seeing it; one that fails its bind is stopped and the start
tries the next. When no group can be placed (no capacity) or launched, the reason is logged
once (again when it changes) and the refill is tried again every `REFILL_RETRY` seconds.

**Nothing left behind.** A gateway that stops stops its pooled groups. Their kernel ids are
also kept in ``<state dir>/pool.json`` (0600) while they live, so that a gateway killed
outright leaves none running: the next one stops, for `LEFTOVER_WINDOW` seconds after it
starts, every replica its hosts report under one of those ids (no kernel of the gateway's
has such an id: a start takes a group out of the file as it takes it from the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import zmq.asyncio

from kernelfleet.errors import FleetError, NotFound
from kernelfleet.gateway.admission import Admission
from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.launcher import ReplicaLauncher
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.gateway.records import KernelRecord, ReplicaRecord
from kernelfleet.gateway.replication import send_request
from kernelfleet.gateway.store import (
    FORMAT_VERSION,
    StateUnreadable,
    read_json_list,
    write_json_atomically,
)
from kernelfleet.protocol import BindContent, Request

log = logging.getLogger("kernelfleet.gateway.pool")

REFILL_RETRY = 2.0
"""Seconds between two tries at refilling a pool that could not be refilled (and between two
health checks of the groups it holds)."""
BIND_TIMEOUT = 5.0
"""Seconds a pooled replica has to answer its bind; past that its group is given up."""
REPORT_GRACE = 5.0
"""Seconds after a group was ready during which a host report that does not list one of its
replicas yet (sent before the launch ended) is not taken for a loss."""
LEFTOVER_WINDOW = 60.0
"""Seconds after a gateway starts during which it stops the replicas of a previous gateway's
pooled groups as their hosts report them (hosts re-register within a few heartbeats)."""
DEMAND_WINDOW = 600.0
"""Seconds of kernel starts the pool remembers when it sizes itself (`pool_target`)."""
FILLS_REMEMBERED = 5
"""How many recent fill times the refill time is the longest of."""
_RUNNING = ("starting", "ready")


def pool_target(starts: Sequence[float], refill_s: float, floor: int, ceiling: int) -> int:
    """How many groups a pool should hold: the most of `starts` (times in ascending order)
    that fall within any `refill_s` seconds, so that such a burst finds a group for each start
    while the pool refills; never under `floor` nor over `ceiling`."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] > refill_s:
            first += 1
        most = max(most, last - first + 1)
    return max(floor, min(ceiling, most))


class KernelPool:
    """The warm pool; see the module docstring. `size` 0: off (`take` always says None)."""

    def __init__(
        self,
        size: int,
        name: str,
        launch: tuple[str, int],
        admission: Admission,
        launcher: ReplicaLauncher,
        hosts: HostRegistry,
        context: zmq.asyncio.Context,
        metrics: FleetMetrics,
        state_file: Path | None = None,
        ceiling: int = 0,
    ) -> None:
        self.size = size
        self.ceiling = max(size, ceiling)
        """The most groups it grows to for bursts of starts (`size`: it never grows)."""
        self._starts: deque[float] = deque()
        """When each start it could serve asked for a group (time.monotonic()), recent ones."""
        self._fill_times: deque[float] = deque(maxlen=FILLS_REMEMBERED)
        self._file = state_file
        """Where the ids of the groups it holds are kept (None: nowhere)."""
        self._leftovers = self._load()
        """Kernel ids of a previous gateway's pooled groups, whose replicas are stopped."""
        self._leftovers_stopped: set[str] = set()
        self._name = name
        self._launch = launch
        """(the kernelspec hosts launch, replicas) of the groups it holds."""
        self._admission = admission
        self._launcher = launcher
        self._hosts = hosts
        self._context = context
        self._metrics = metrics
        self._ready: list[tuple[KernelRecord, float]] = []
        """Groups ready to be taken, oldest first, with the time.monotonic() they got ready."""
        self._filling: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._said = ""
        """The last reason the pool could not be refilled (logged once per reason)."""
        self._closed = False

    # ---- what kernel starts ask ------------------------------------------------------------

    def ids(self) -> set[str]:
        """The kernel ids of the groups held or being started (their object store folders
        are in use)."""
        return {kernel.id for kernel, _ in self._ready} | set(self._filling)

    @property
    def target(self) -> int:
        """How many groups it holds now (see "How many" in the module docstring)."""
        if self.ceiling <= self.size:
            return self.size
        cutoff = time.monotonic() - DEMAND_WINDOW
        recent = [at for at in self._starts if at >= cutoff]
        refill_s = max(self._fill_times, default=0.0)
        return pool_target(recent, refill_s, self.size, self.ceiling)

    def unfit(self, kernel: KernelRecord, per_session: bool) -> str | None:
        """Why `kernel`'s start cannot take a pooled group (None: it can)."""
        if self.size <= 0:
            return "the pool is off (GatewayApp.kernel_pool_size = 0)"
        if (kernel.launch_name, kernel.replicas_wanted) != self._launch:
            launch, replicas = self._launch
            return (
                f"the pool holds {launch!r} x{replicas}, "
                f"not {kernel.launch_name!r} x{kernel.replicas_wanted}"
            )
        launch_only = sorted(name for name in kernel.env if not name.startswith("KERNEL_"))
        if launch_only:
            return f"env {', '.join(launch_only)} must be set when a process starts"
        if per_session and kernel.gpus:
            return "the policy holds a kernel's GPUs for its whole life: it is placed with them"
        return None

    async def take(self, start: KernelRecord) -> KernelRecord | None:
        """A pooled group bound to `start` (its env, working directory, name, GPUs, user and
        notebook path), under the group's own kernel id; None when none is ready (the start
        is then cold). A group found dead or failing its bind is stopped and the next one
        tried. The pool is refilled in the background."""
        if self.ceiling > self.size:  # the demand it sizes itself by
            now = time.monotonic()
            self._starts.append(now)
            while self._starts[0] < now - DEMAND_WINDOW:
                self._starts.popleft()
            self._wake.set()
        while self._ready:
            kernel, ready_since = self._ready[0]
            small = self._too_small(kernel, start.gpus)
            if small is not None:
                log.info(
                    "kernel start: the pooled group does not fit it (%s), so it starts cold", small
                )
                return None  # the group stays for a start it fits
            self._ready.pop(0)
            self._changed()
            why = self._loss(kernel, ready_since)
            if why is None:
                try:
                    await self._bind(kernel, start.env)
                except FleetError as e:
                    why = f"its bind failed: {e}"
            if why is not None:
                self._give_up(kernel, why)
                continue
            kernel.name, kernel.env, kernel.gpus = start.name, start.env, start.gpus
            kernel.notebook_path, kernel.user = start.notebook_path, start.user
            kernel.started_from_pool = True
            kernel.last_activity = datetime.now(UTC)  # not the pool's: a culler would take it
            for replica in kernel.replicas:
                self._launcher.subscribe(kernel, replica)  # its GPU need, from now on
            return kernel
        log.info("kernel start: the pool is empty, so it starts cold")
        return None

    def _too_small(self, kernel: KernelRecord, gpus: int) -> str | None:
        """Why pooled `kernel`'s hosts cannot run a cell of `gpus` GPUs (None: they can; a cold
        start is placed where it fits, or refused if it never does)."""
        for replica in kernel.replicas:
            with contextlib.suppress(NotFound):
                host = self._hosts.get(replica.host_id)
                if len(host.gpus) < gpus:
                    return f"{host.id} has {len(host.gpus)} GPU(s), the kernel wants {gpus}"
        return None

    async def _bind(self, kernel: KernelRecord, env: dict[str, str]) -> None:
        content = BindContent(env=dict(env), working_dir=env.get("KERNEL_WORKING_DIR", ""))
        await asyncio.gather(
            *(
                send_request(
                    self._context, replica.connection, Request.BIND, content, BIND_TIMEOUT,
                    f"pooled replica {replica.id} binding its start",
                )
                for replica in kernel.replicas
            )
        )  # fmt: skip

    # ---- keeping it full -------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the pool full and its groups alive, until cancelled (then `close`); and stop
        what a previous gateway's pool left (see the module docstring)."""
        leftovers_until = time.monotonic() + LEFTOVER_WINDOW
        while not self._closed:
            if self._leftovers:
                self._stop_leftovers(done=time.monotonic() > leftovers_until)
            elif self.size <= 0:
                return
            if self.size > 0:
                self._check_health()
                self._shrink()
                if any(host.takes_work for host in self._hosts.all()):  # none: nothing to say
                    self._refill()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), REFILL_RETRY)

    def _shrink(self) -> None:
        """Stop the ready groups beyond the target, newest first (a burst was forgotten)."""
        target = self.target
        while len(self._ready) > target:
            kernel, _ = self._ready.pop()
            self._changed()
            self._give_up(kernel, f"the pool keeps {target} group(s) now", replaced=False)

    def _refill(self) -> None:
        target = self.target
        self._metrics.pool_target.set(target)
        while len(self._ready) + len(self._filling) < target:
            kernel = self._new_kernel()
            try:
                placement = self._admission.place(kernel)
            except FleetError as e:
                self._cannot(f"no capacity for a pooled group ({e}); kernel starts are cold")
                return
            task = asyncio.ensure_future(self._fill(kernel, placement.host_ids))
            self._filling[kernel.id] = task
            self._save()

    def _new_kernel(self) -> KernelRecord:
        """A kernel of its own for a new group: a fresh random id, the pool's launch, no GPU."""
        launch_name, replicas = self._launch
        return KernelRecord(
            id=str(uuid.uuid4()),
            name=self._name,
            env={},
            launch_name=launch_name,
            replicas_wanted=replicas,
        )

    async def _fill(self, kernel: KernelRecord, host_ids: tuple[str, ...]) -> None:
        started = time.monotonic()
        try:
            await self._launcher.launch_group(kernel, host_ids)
        except FleetError as e:
            self._cannot(f"a pooled group could not be started on {', '.join(host_ids)}: {e}")
            return
        except Exception:
            log.exception("a pooled group could not be started on %s", ", ".join(host_ids))
            return
        finally:
            self._filling.pop(kernel.id, None)
            self._save()
        if self._closed:
            self._give_up(kernel, "the pool is closing")
            return
        self._said = ""
        self._fill_times.append(time.monotonic() - started)
        self._ready.append((kernel, time.monotonic()))
        self._changed()
        log.info(
            "pooled group %s ready on %s in %.2f s",
            kernel.id, ", ".join(host_ids), time.monotonic() - started,
        )  # fmt: skip

    def _check_health(self) -> None:
        """Give up (and so replace) every ready group that lost a replica."""
        for entry in list(self._ready):
            kernel, ready_since = entry
            why = self._loss(kernel, ready_since)
            if why is not None:
                self._ready.remove(entry)
                self._changed()
                self._give_up(kernel, why)

    def _loss(self, kernel: KernelRecord, ready_since: float) -> str | None:
        """Why pooled `kernel` cannot serve a start any more, from its hosts' last reports."""
        for replica in kernel.replicas:
            why = self._replica_loss(replica, ready_since)
            if why is not None:
                return f"its replica {replica.id} {why}"
        return None

    def _replica_loss(self, replica: ReplicaRecord, ready_since: float) -> str | None:
        try:
            host = self._hosts.get(replica.host_id)
        except NotFound:
            return f"is on {replica.host_id}, which is forgotten"
        if not host.takes_work:
            return f"is on {host.id}, which is {host.state.value}"
        model = next((m for m in host.replicas if m.get("id") == replica.id), None)
        if model is None:
            if time.monotonic() - ready_since > REPORT_GRACE:
                return f"is no longer listed by {host.id}"
            return None
        if model.get("state") not in _RUNNING:
            return f"is {model.get('state')} (exit code {model.get('exit_code')})"
        return None

    def _give_up(self, kernel: KernelRecord, why: str, replaced: bool = True) -> None:
        """Stop a pooled group (in the background); the refill replaces it if `replaced`."""
        if self._closed or not replaced:
            log.info("pooled group %s stopped: %s", kernel.id, why)
        else:
            log.info("pooled group %s given up and replaced: %s", kernel.id, why)
        if kernel.link is not None:
            kernel.link.close(why)
        task = asyncio.ensure_future(self._launcher.stop(kernel, kernel.replicas))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        self._wake.set()

    def _cannot(self, why: str) -> None:
        if why != self._said:
            log.warning("the kernel pool cannot be refilled now: %s", why)
            self._said = why

    def _changed(self) -> None:
        self._metrics.pool_ready.set(len(self._ready))
        self._save()
        self._wake.set()

    # ---- what a previous gateway left --------------------------------------------------------

    def _load(self) -> set[str]:
        if self._file is None:
            return set()
        try:
            ids = read_json_list(self._file, "pooled")
        except StateUnreadable as e:
            log.warning("%s: a previous gateway's pooled groups, if any, are not stopped", e)
            return set()
        return {kernel_id for kernel_id in ids if isinstance(kernel_id, str)}

    def _save(self) -> None:
        if self._file is None:
            return
        pooled = sorted(self.ids() | self._leftovers)
        if not pooled and not self._file.exists():
            return  # nothing to keep, and nothing kept before
        try:
            write_json_atomically(self._file, {"version": FORMAT_VERSION, "pooled": pooled})
        except OSError as e:
            log.error("cannot write %s: %s", self._file, e)

    def _stop_leftovers(self, done: bool) -> None:
        """Stop the replicas the hosts report under a previous gateway's pooled ids; `done`:
        the window is over, forget those ids."""
        for host in self._hosts.all():
            if not host.alive:
                continue
            for model in host.replicas:
                replica_id = model.get("id")
                if (
                    model.get("kernel_id") in self._leftovers
                    and model.get("state") in _RUNNING
                    and isinstance(replica_id, str)
                    and replica_id not in self._leftovers_stopped
                ):
                    self._leftovers_stopped.add(replica_id)
                    log.warning(
                        "stopping replica %s on %s: it is of pooled group %s, which a previous "
                        "gateway left", replica_id, host.id, model.get("kernel_id"),
                    )  # fmt: skip
                    task = asyncio.ensure_future(self._stop_leftover(host, replica_id))
                    self._stopping.add(task)
                    task.add_done_callback(self._stopping.discard)
        if done:
            self._leftovers.clear()
            self._save()

    @staticmethod
    async def _stop_leftover(host: HostRecord, replica_id: str) -> None:
        try:
            await host.client.stop_replica(replica_id)
        except FleetError as e:
            log.error("could not stop replica %s on %s: %s", replica_id, host.id, e)

    async def close(self) -> None:
        """Stop every pooled group (they belong to no kernel, so no later gateway adopts
        them), and wait until they stopped."""
        self._closed = True
        await asyncio.gather(*self._filling.values(), return_exceptions=True)  # they give up
        while self._ready:
            self._give_up(self._ready.pop()[0], "the gateway stops")  # logged as stopped
        self._changed()
        await asyncio.gather(*self._stopping, return_exceptions=True)
        self._leftovers.clear()
        self._save()
