"""The gateway's view of its host agents, kept current by their heartbeats and links.

A host agent registers and heartbeats with one idempotent call (``PUT /api/fleet/hosts/{id}``)
carrying its GPUs and replicas. A host being emptied to be stopped is DRAINING, then STOPPING;
one dropped on purpose (`HostRegistry.forget`) is GIVEN_UP, and the registry forgets it.

How a lost host is seen (docs/architecture.md, "Host liveness"):

- **its link breaks** (fast path): once registered, an agent keeps a websocket open to the
  gateway (``/api/fleet/hosts/{id}/link``, `HostLinkHandler`), which pings it. The agent's
  death closes the socket at once (its kernel closes the process's sockets, so a host killed
  outright is seen within milliseconds); a host that stops answering pings (stopped, its network
  cut) is closed by the gateway after the link's ping timeout (about 2 s). Either way
  `link_closed` marks it LOST, if that link was its current agent's;
- **its heartbeats stop** (the path for an agent that keeps no link): a host without a link,
  silent for ``heartbeat_timeout`` seconds, is LOST (`check_liveness`). A linked host whose
  heartbeats are late is not: its link answers pings, so its agent is alive and heard, only
  busy (a report of many replicas) or held up by the gateway's own loop. A scale run lost a
  second host that way, after a stall of the gateway's loop that the lost first one caused.
  `watch_liveness` also skips a round after the gateway itself stalled, so the heartbeats
  queued meanwhile are applied before anyone is judged.

A heartbeat brings a LOST host back to ALIVE. Bad input: a report with a wrong token is refused
(401) and logged once per agent (`refuse_token`); a second agent claiming a live host's id (another
instance at another address) is refused with `Conflict` naming the host and the other agent's
address, and the first is left alone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelfleet.errors import Conflict, InvalidRequest, NotFound
from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.gateway.gpu_speeds import checked_gpus
from kernelfleet.kernels.agent.client import HostAgentClient
from kernelfleet.scheduler.hostkinds import ON_DEMAND, check_kind
from kernelfleet.states import Transitions, check_transition

log = logging.getLogger("kernelfleet.gateway.hosts")


class HostState(enum.Enum):
    """A host's life in the gateway.

    Only ALIVE hosts take new replicas and cells. DRAINING, STOPPING and ALIVE hosts heartbeat
    (`HostRecord.alive`); the admin API and the agents are shown only that, as ``alive`` or
    ``lost`` (`HostRecord.liveness`).
    """

    ALIVE = "alive"
    DRAINING = "draining"
    """Its replicas are being moved away so it can be stopped; it takes no new work."""
    STOPPING = "stopping"
    """Drained; its provider is stopping it. It takes no new work."""
    LOST = "lost"
    """It missed its heartbeats; its replicas were given up for dead. A heartbeat revives it."""
    GIVEN_UP = "given-up"
    """Forgotten on purpose (stopped); the registry drops it, a later report registers anew."""


_H = HostState
HOST_TRANSITIONS: Transitions[HostState] = {
    _H.ALIVE: frozenset({_H.DRAINING, _H.LOST, _H.GIVEN_UP}),
    _H.DRAINING: frozenset({_H.ALIVE, _H.STOPPING, _H.LOST, _H.GIVEN_UP}),  # ALIVE: it failed
    _H.STOPPING: frozenset({_H.LOST, _H.GIVEN_UP}),  # one that cannot be stopped stays closed
    _H.LOST: frozenset({_H.ALIVE, _H.GIVEN_UP}),
    _H.GIVEN_UP: frozenset(),
}

_HEARTBEATING = frozenset({_H.ALIVE, _H.DRAINING, _H.STOPPING})


@dataclass(frozen=True)
class ContainerSupport:
    """A host's container engine as its agent reports it (``containers`` in the host model)."""

    engine: str
    reachable: bool
    why: str = ""
    """Why it is not reachable ("" when it is)."""

    @classmethod
    def parse(cls, value: Any) -> ContainerSupport | None:
        """The report's ``containers`` member (None or absent: no engine); `InvalidRequest`
        naming the field when it is malformed."""
        if value is None:
            return None
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("engine"), str)
            or not isinstance(value.get("reachable"), bool)
            or not isinstance(value.get("why") or "", str)
        ):
            raise InvalidRequest(
                "a host report's 'containers' must be null or {\"engine\": str, "
                f'"reachable": bool, "why": str or null}}, not {value!r}'
            )
        return cls(value["engine"], value["reachable"], value.get("why") or "")


@dataclass
class HostRecord:
    """One registered host agent."""

    id: str
    address: str
    client: HostAgentClient
    gpus: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    instance: str | None = None
    state: HostState = HostState.ALIVE
    last_seen: float = 0.0
    gpu_type: str = "none"
    """The type its GPUs are, as its agent advertises it (job schedulers group GPUs by it)."""
    kind: str = ON_DEMAND
    """``on-demand`` or ``spot`` (revocable), as its agent says (`scheduler.hostkinds`)."""
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """The background job processes its agent runs or saw exit (`kernels.agent.jobs`)."""
    workers: list[dict[str, Any]] = field(default_factory=list)
    """The tool workers its agent runs or saw exit (`kernels.agent.tool_workers`)."""
    isolation: dict[str, str] | None = None
    """Which user its kernels run as, as the agent reports it (`parse_isolation`); None: it
    did not say."""
    lost_why: str = ""
    """Why it was last marked LOST, for the messages of the replicas lost with it."""
    link: int | None = None
    """The serial of the link its current agent holds open (`HostRegistry.link_opened`);
    None: no link (not yet, or it broke)."""
    containers: ContainerSupport | None = None
    """Its container engine as its agent last reported it; None: it runs no containers."""
    gpu_settings: list[dict[str, Any]] = field(default_factory=list)
    """The devices whose clocks or power limit its agent changed, and for whom (`{"uuid",
    "kernel_id", "binding", "replica_id"}`), as last reported (`kernelfleet.gateway.
    gpu_settings`)."""

    def move_to(self, state: HostState) -> None:
        """Go to `state`; `IllegalTransition` (naming this host) if its table forbids it."""
        self.state = check_transition(HOST_TRANSITIONS, f"host {self.id}", self.state, state)

    @property
    def alive(self) -> bool:
        """Whether it heartbeats (ALIVE, DRAINING or STOPPING): its agent can be called."""
        return self.state in _HEARTBEATING

    @property
    def takes_work(self) -> bool:
        """Whether new replicas and cells may go there (ALIVE only)."""
        return self.state is HostState.ALIVE

    @property
    def runs_containers(self) -> bool:
        """Whether a container kernel's replica may go there: its agent has an engine and
        reaches it."""
        return self.containers is not None and self.containers.reachable

    @property
    def liveness(self) -> str:
        """What the admin API and the agent are shown: ``alive`` while it heartbeats, else
        ``lost`` (draining and stopping are the gateway's own business)."""
        return (HostState.ALIVE if self.alive else HostState.LOST).value


ISOLATION_KERNEL_USERS = ("per-kernel", "agent")
"""What a host's ``isolation.kernel_user`` may say: kernels run as users of their own, or as the
agent's user (`kernelfleet.kernels.agent.kernel_process.Isolation.model`)."""


def parse_isolation(value: Any) -> dict[str, str] | None:
    """A host report's ``isolation``: ``{"kernel_user": "per-kernel" | "agent", "why": str}``,
    or None when absent or null; `InvalidRequest` for anything else."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or set(value) != {"kernel_user", "why"}
        or value["kernel_user"] not in ISOLATION_KERNEL_USERS
        or not isinstance(value["why"], str)
    ):
        raise InvalidRequest(
            '\'isolation\' must be {"kernel_user": "per-kernel" or "agent", "why": text}'
        )
    return {"kernel_user": value["kernel_user"], "why": value["why"]}


class HostListener(Protocol):
    """Who applies what hosts report (the gateway's `HostReconciler`)."""

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        """`host` heartbeated; `restarted`: its agent restarted since its last report (its
        ``instance`` changed), so replicas it no longer lists are gone, not merely unlisted."""

    def on_host_lost(self, host: HostRecord) -> None:
        """`host` stopped heartbeating, or is being forgotten while it still did."""


class HostRegistry:
    """Registered hosts by id. Callers pass ``now`` (monotonic seconds) so tests can drive time."""

    def __init__(
        self, token: str, heartbeat_timeout: float, events: EventBus | None = None
    ) -> None:
        self._events = events or EventBus()
        self._token = token
        self._heartbeat_timeout = heartbeat_timeout
        self._listener: HostListener | None = None
        self._observers: list[HostListener] = []
        self._hosts: dict[str, HostRecord] = {}
        self._watchers: list[Callable[[], None]] = []
        self._refused: set[tuple[str, str]] = set()
        """(host id, remote address) of agents already logged as refused."""
        self._links = 0
        self._closed = False

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (no arguments, on the event loop) whenever a host registers or comes
        back: what waits for a host (a repair, say) may try again at once."""
        self._watchers.append(callback)

    def listen(self, listener: HostListener) -> None:
        """Send every later report and loss to `listener` (one; the kernel service sets it
        when it is built, before any host can report)."""
        self._listener = listener

    def observe(self, observer: HostListener) -> None:
        """Also send every later report and loss to `observer`, after the listener (the jobs
        service: the listener has updated the GPU ledger by then)."""
        self._observers.append(observer)

    def report(self, host_id: str, body: dict[str, Any], now: float) -> HostRecord:
        """Record a heartbeat (the first one registers the host), then tell the listener
        (`HostListener.on_report`)."""
        address = body.get("address")
        if not isinstance(address, str) or not address.startswith(("http://", "https://")):
            raise InvalidRequest("a host report needs 'address', the agent's http(s) URL")
        if body.get("id", host_id) != host_id:
            raise InvalidRequest(
                f"the report names host {body.get('id')!r} but was sent for {host_id!r}"
            )
        gpus, replicas = body.get("gpus", []), body.get("replicas", [])
        if not isinstance(gpus, list) or not isinstance(replicas, list):
            raise InvalidRequest("'gpus' and 'replicas' must be lists")
        gpus = checked_gpus(gpus)
        isolation = parse_isolation(body.get("isolation"))
        gpu_type, jobs = body.get("gpu_type", "none"), body.get("jobs", [])
        if not isinstance(gpu_type, str) or not gpu_type or not isinstance(jobs, list):
            raise InvalidRequest("'gpu_type' must be a non-empty string and 'jobs' a list")
        kind = check_kind(body.get("kind", ON_DEMAND), "a host report's 'kind'")
        containers = ContainerSupport.parse(body.get("containers"))
        workers = body.get("workers", [])
        if not isinstance(workers, list):
            raise InvalidRequest("'workers' must be a list")
        instance = body.get("instance")
        host = self._hosts.get(host_id)
        if host is not None:
            self._check_same_agent(host, address, instance)
        new = host is None
        if host is None:
            host = HostRecord(
                id=host_id, address=address, client=HostAgentClient(address, self._token)
            )
            self._hosts[host_id] = host
            log.info("host %s registered at %s with %d GPU(s)", host_id, address, len(gpus))
        if host.address != address:
            host.client.close()
            host.address, host.client = address, HostAgentClient(address, self._token)
        returned = not host.alive
        if returned:
            host.move_to(HostState.ALIVE)
            log.warning("host %s is back after missing its heartbeats", host_id)
        restarted = host.instance is not None and instance != host.instance
        if restarted:
            log.warning(
                "host %s restarted (agent instance %s -> %s)", host_id, host.instance, instance
            )
        host.gpus, host.replicas, host.instance, host.last_seen = gpus, replicas, instance, now
        host.isolation, host.gpu_type, host.jobs = isolation, gpu_type, jobs
        host.kind = kind
        before, host.containers = host.containers, containers
        if containers is not None and (before is None or before.reachable != containers.reachable):
            if containers.reachable:
                log.info("host %s runs containers (engine %s)", host_id, containers.engine)
            else:
                log.warning("host %s cannot run containers: %s", host_id, containers.why)
        host.workers = [worker for worker in workers if isinstance(worker, dict)]
        changed = body.get("gpu_settings", [])
        host.gpu_settings = (
            [c for c in changed if isinstance(c, dict)] if isinstance(changed, list) else []
        )
        if new or returned:
            data = {"address": address, "gpus": len(gpus), "returned": returned}
            self._events.publish(EventType.HOST_ADDED, data, host_id=host_id)
        if restarted:
            host.link = None  # the old agent's link, if it still seems open, is not its
        for listener in self._listeners():
            listener.on_host_report(host, restarted)
        if new or returned:
            for callback in self._watchers:
                callback()
        return host

    def _check_same_agent(self, host: HostRecord, address: str, instance: Any) -> None:
        """`Conflict` if another agent claims live `host`: another instance at another address
        (one agent cannot listen where another does, so a new instance at the same address is
        that agent restarted). Logged once per claimant; the live host is left alone."""
        if not host.alive or host.instance is None or instance == host.instance:
            return
        if address == host.address:
            return
        message = (
            f"host {host.id} is already registered by the agent at {host.address}, which is "
            f"alive; the agent at {address} must use another host id (--host-id), or wait until "
            f"that one stops"
        )
        if (host.id, address) not in self._refused:
            self._refused.add((host.id, address))
            log.error("refused a second agent claiming host %s: %s", host.id, message)
        raise Conflict(message, reason="host-id-taken")

    def refuse_token(self, host_id: str, remote: str) -> None:
        """A report or link for `host_id` from `remote` presented a wrong token: log it the
        first time this agent does (the caller answers 401 every time)."""
        if (host_id, remote) in self._refused:
            return
        self._refused.add((host_id, remote))
        log.error(
            "refused host agent %r at %s: wrong fleet token (start it with the gateway's "
            "token: --token or $KERNELFLEET_TOKEN); its later tries are refused silently",
            host_id,
            remote,
        )

    def check_link(self, host_id: str, instance: str) -> HostRecord:
        """May agent `instance` open `host_id`'s link? `NotFound` for a host that has not
        registered (an agent opens it after its first heartbeat), `Conflict` if `instance` is
        not the host's current agent."""
        host = self.get(host_id)
        if instance != host.instance:
            raise Conflict(
                f"host {host_id} is registered by another agent (at {host.address})",
                reason="host-id-taken",
            )
        return host

    def link_opened(self, host_id: str, instance: str) -> int:
        """Agent `instance` opened `host_id`'s link (checked as `check_link`): from now its
        close means the host is lost. Returns the link's serial, for `link_closed`."""
        host = self.check_link(host_id, instance)
        self._links += 1
        host.link = self._links
        log.info("host %s linked: its loss is seen at once", host_id)
        return self._links

    def link_closed(self, host_id: str, link: int, why: str) -> HostRecord | None:
        """Link `link` of `host_id` closed (or stopped answering) for `why`. If it is the
        host's current link and the host heartbeats, the host is LOST now, and returned; else
        nothing happens (an older link, a host already lost or forgotten, a gateway stopping)."""
        host = self._hosts.get(host_id)
        if self._closed or host is None or host.link != link:
            return None
        host.link = None
        if not host.alive:
            return None
        log.error("host %s lost: %s", host_id, why)
        self._lost(host, why)
        return host

    def check_liveness(self, now: float) -> list[HostRecord]:
        """Mark the hosts without a link that were silent for longer than the heartbeat timeout
        LOST; return them. A linked host's loss is its link's to tell (`link_closed`)."""
        lost = []
        for host in self._hosts.values():
            if host.alive and now - host.last_seen > self._heartbeat_timeout:
                if host.link is not None:
                    log.debug(
                        "host %s: no heartbeat for %.1f s, but its link answers pings",
                        host.id,
                        now - host.last_seen,
                    )
                    continue
                log.error(
                    "host %s missed its heartbeats for %.1f s: marked lost",
                    host.id,
                    now - host.last_seen,
                )
                self._lost(host, f"missed its heartbeats for {now - host.last_seen:.1f} s")
                lost.append(host)
        return lost

    async def watch_liveness(self, interval: float, stop: asyncio.Event) -> None:
        """`check_liveness` every `interval` seconds until `stop` is set, except in a round
        that began more than `interval` late: the gateway's loop stalled, no heartbeat could be
        applied meanwhile, and those that queued up are applied first (one round later)."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            due = loop.time() + interval
            await asyncio.sleep(interval)
            late = loop.time() - due
            if late > interval:
                log.info("the gateway stalled %.1f s: hosts are judged next round", late)
                continue
            self.check_liveness(time.monotonic())

    def stopping(self, host_id: str) -> None:
        """A drained host is about to be stopped (the autoscaler's `HostRetirement`): it stays
        closed to new work, even if stopping it fails. Ignored unless it is draining."""
        host = self._hosts.get(host_id)
        if host is not None and host.state is HostState.DRAINING:
            host.move_to(HostState.STOPPING)

    def forget(self, host_id: str) -> None:
        """Drop a host that was stopped on purpose (scaled in), at once rather than after its
        heartbeats stop: it is GIVEN_UP. If it still heartbeated, the listener's `on_host_lost`
        runs first, so whatever it still held is handled as lost. Unknown ids are ignored: a
        host is forgotten once."""
        host = self._hosts.get(host_id)
        if host is None:
            return
        if host.alive:
            self._lost(host, "stopped on purpose")
        host.move_to(HostState.GIVEN_UP)
        del self._hosts[host_id]
        host.client.close()
        log.info("host %s forgotten: it was stopped", host_id)

    def _lost(self, host: HostRecord, why: str) -> None:
        """LOST (from any heartbeating state), then the listener's `on_host_lost`. A link it
        still holds stays its own: if it comes back, that link's close loses it again."""
        if host.alive:
            host.lost_why = why
            host.move_to(HostState.LOST)
            self._events.publish(EventType.HOST_LOST, {"why": why}, host_id=host.id)
        for listener in self._listeners():
            listener.on_host_lost(host)

    def _listeners(self) -> list[HostListener]:
        return [*([self._listener] if self._listener is not None else []), *self._observers]

    def get(self, host_id: str) -> HostRecord:
        try:
            return self._hosts[host_id]
        except KeyError:
            raise NotFound(f"no host with id {host_id!r}") from None

    def all(self) -> list[HostRecord]:
        return sorted(self._hosts.values(), key=lambda host: host.id)

    def close(self) -> None:
        """The gateway stops: links closing from now on say nothing about their hosts."""
        self._closed = True
        for host in self._hosts.values():
            host.client.close()
