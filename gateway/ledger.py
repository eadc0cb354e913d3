"""The gateway's GPU ledger: per host, the devices it has, who claims them and who holds them.

Three layers per host, as NotebookOS keeps them (docs/notebookos.md):

- **spec**: the device ids the host reports, in its order (`device_ids_of` turns a host report's
  ``gpus`` into ids: the device index as a string, what ``CUDA_VISIBLE_DEVICES`` and
  ``torch.cuda.set_device`` take on that host);
- **claims** ("subscribed"): each live replica's GPU need, not exclusive. A replica has at most
  one claim, on the host it runs on;
- **bindings** ("committed"): device ids bound exclusively to one cell of one replica. A replica
  holds at most one binding, and only on the host of its claim.

Devices no cell holds may be **lent** to background jobs (`kernelfleet.gateway.jobs`): a loan is
not a binding, cells first. Cells and their policies see lent devices as free; `commit` prefers
devices not lent, and when it takes lent ones it ends their loans and names the jobs in
`Commitment.preempted`, which the caller stops before the cell starts.

A kernel's running cell may also **hold** devices of any hosts for its tool workers (worker
processes the cell's code starts through the gateway, `kernelfleet.gateway.tool_workers`): a
hold (`WorkerHold`, per group of workers) is exclusive like a binding, is never lent, counts as
committed, and is not a binding (it belongs to no replica and may be on hosts where the kernel
has none). `hold` takes devices lent to jobs last and ends their loans (cells first, as
`commit`); holds go only when `unhold` ends them (the caller knows the workers are gone), when
their host is dropped or when it stops reporting the device. They outlive the kernel's claims: a
kernel that goes keeps its holds until its workers are known to have stopped, so no cell is
given a device a worker may still use.

Besides, the ledger remembers which replica's memory may still be **warm** on a free device (it
was bound there and has not offloaded since); `commit` prefers a replica's own warm devices and
says whose warm memory it displaces, so the caller can have that replica offload first.

Each device has a **relative speed** (`kernelfleet.gateway.gpu_speeds`: 1.0 is a typical GPU of
its type), derived from the fingerprints hosts report, fleet-wide; after the replica's own warm
devices, `commit` prefers the fastest, and `host_snapshot` tells policies how fast a host's free
GPUs are.

A host that reports fewer devices than before (`set_host`) keeps the bindings on the devices it
lost until they are released: those devices are listed as ``vanished`` and the host as
over-committed, they count for nobody's free GPUs, and free counts never go negative.

Every method is synchronous and runs on the gateway's event loop; none does I/O.
`check_invariants` raises `LedgerInconsistent` naming the exact breach. A **checked** ledger
(``GpuLedger(checked=True)``) runs it after every mutating method; a breach is logged at ERROR,
counted in ``breaches`` and passed to ``on_breach``, and never raised: the gateway goes on.

The records it hands out (`Claim`, `Binding`, `Commitment`, `HostGpuView`, `LedgerTotals`) are
in `kernelfleet.gateway.ledger_records`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from kernelfleet.errors import (
    Conflict,
    GpusUnavailable,
    InvalidRequest,
    LedgerInconsistent,
    NoCapacity,
    NotFound,
)
from kernelfleet.gateway.gpu_speeds import SpeedBasis, relative_speeds
from kernelfleet.gateway.ledger_records import (
    Binding,
    Claim,
    Commitment,
    HostGpuView,
    LedgerTotals,
    ReplicaKey,
    WorkerHold,
)
from kernelfleet.scheduler.snapshot import HostSnapshot

log = logging.getLogger("kernelfleet.gateway.ledger")

_P = ParamSpec("_P")
_R = TypeVar("_R")


def device_ids_of(gpus: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The device ids of a host report's ``gpus`` list (`GpuDevice.to_dict` values), in index
    order: each device's ``index`` as a string."""
    try:
        indices = sorted(int(gpu["index"]) for gpu in gpus)
    except (KeyError, TypeError, ValueError):
        raise InvalidRequest("every GPU in a host report needs an integer 'index'") from None
    return tuple(str(index) for index in indices)


@dataclass
class _Host:
    devices: tuple[str, ...]
    vanished: set[str] = field(default_factory=set)
    warm: dict[str, ReplicaKey] = field(default_factory=dict)
    lent: dict[str, str] = field(default_factory=dict)
    """Device -> the job it is lent to."""
    held: dict[str, WorkerHold] = field(default_factory=dict)
    """Device -> the tool workers it is held for."""
    speed_bases: dict[str, SpeedBasis] = field(default_factory=dict)
    """Device -> what its relative speed is derived from (none: 1.0)."""


def _mutates(
    method: Callable[Concatenate[GpuLedger, _P], _R],
) -> Callable[Concatenate[GpuLedger, _P], _R]:
    """Mark a method that changes the ledger: a checked ledger audits itself after it (after
    it raised, too: an error half-way through is when a breach is likeliest)."""

    @functools.wraps(method)
    def audited(self: GpuLedger, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self.checked:
            return method(self, *args, **kwargs)
        self._depth += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._audit(method.__name__, args, kwargs)

    return audited


class GpuLedger:
    """Spec, claims and bindings of every host; see the module docstring.

    ``checked``: run `check_invariants` after every mutating method (`set_host`, `drop_host`,
    `subscribe`, `unsubscribe`, `remove_kernel`, `commit`, `release`, `mark_cold`, `lend`,
    `reclaim`, `hold`, `unhold`), once per outermost call. A breach (the first one
    `check_invariants` finds) is logged at ERROR with the call that revealed it, and counted
    in ``breaches`` and through ``on_breach(message)`` once, when first seen: one that
    persists is not counted again on every later event, a different one is. Costs one full
    check (linear in hosts, claims and bindings) per event.
    """

    def __init__(
        self, checked: bool = False, on_breach: Callable[[str], None] | None = None
    ) -> None:
        self._hosts: dict[str, _Host] = {}
        self._claims: dict[ReplicaKey, Claim] = {}
        self._bindings: dict[ReplicaKey, Binding] = {}
        self.checked = checked
        self.breaches = 0
        """Distinct breaches a checked ledger found (see the class docstring)."""
        self._on_breach = on_breach
        self._depth = 0
        self._breach: str | None = None
        self._release_listeners: list[Callable[[Binding], None]] = []
        self._speeds: dict[str, dict[str, float]] | None = None
        """Host -> device -> relative speed; None: to be derived again (`speeds`)."""
        if checked:
            log.info("the GPU ledger checks its invariants after every change")

    # ---- hosts -----------------------------------------------------------------------------

    @_mutates
    def set_host(
        self,
        host_id: str,
        device_ids: Iterable[str],
        speed_bases: Mapping[str, SpeedBasis] | None = None,
    ) -> tuple[str, ...]:
        """Register a host or take its newly reported devices; call it on every host report.

        `speed_bases`: what each device's relative speed derives from
        (`kernelfleet.gateway.gpu_speeds.speed_bases`); a device without one is 1.0.
        Returns the bound devices the host no longer reports (newly vanished). Their bindings
        stay until released; devices that come back are ordinary again. Duplicate or empty ids
        are `InvalidRequest`.
        """
        devices = tuple(device_ids)
        if len(set(devices)) != len(devices) or not all(devices):
            raise InvalidRequest(f"host {host_id} reports duplicate or empty GPU ids: {devices}")
        host = self._hosts.setdefault(host_id, _Host(devices))
        host.devices = devices
        bound = self._bound_devices(host_id)
        newly_vanished = tuple(sorted(bound - set(devices) - host.vanished))
        host.vanished = bound - set(devices)
        host.warm = {d: owner for d, owner in host.warm.items() if d in devices}
        host.lent = {d: job for d, job in host.lent.items() if d in devices}
        host.held = {d: hold for d, hold in host.held.items() if d in devices}
        bases = {d: basis for d, basis in (speed_bases or {}).items() if d in devices}
        if bases != host.speed_bases or self._speeds is None or host_id not in self._speeds:
            host.speed_bases = bases
            self._speeds = None
        return newly_vanished

    @_mutates
    def drop_host(self, host_id: str) -> tuple[Binding, ...]:
        """Forget a host that is lost or stopped: its claims and bindings go with it.

        Returns the bindings that were cut (their cells lost their GPUs). Idempotent."""
        if self._hosts.pop(host_id, None) is None:
            return ()
        self._speeds = None
        cut = tuple(b for b in self._bindings.values() if b.host_id == host_id)
        for binding in cut:
            del self._bindings[(binding.kernel_id, binding.replica_id)]
        for key in [key for key, claim in self._claims.items() if claim.host_id == host_id]:
            del self._claims[key]
        self._released(cut)
        return cut

    def hosts(self) -> list[str]:
        return sorted(self._hosts)

    # ---- claims ----------------------------------------------------------------------------

    @_mutates
    def subscribe(self, host_id: str, kernel_id: str, replica_id: str, gpus: int) -> None:
        """Claim `gpus` GPUs for a replica on its host (again: update the need).

        `NotFound` for an unknown host, `InvalidRequest` for a negative count, `Conflict` if
        the replica is subscribed on another host (unsubscribe it there first)."""
        self._host(host_id)
        _check_count(gpus)
        key = (kernel_id, replica_id)
        claim = self._claims.get(key)
        if claim is not None and claim.host_id != host_id:
            raise Conflict(
                f"replica {replica_id} of kernel {kernel_id} is subscribed on host "
                f"{claim.host_id}, not {host_id}"
            )
        self._claims[key] = Claim(host_id, kernel_id, replica_id, gpus)

    @_mutates
    def unsubscribe(self, kernel_id: str, replica_id: str) -> Binding | None:
        """The replica stopped, died or moved away: its claim, its binding and its warm memory
        leave the ledger. Returns the binding it still held, if any. Idempotent."""
        key = (kernel_id, replica_id)
        self._claims.pop(key, None)
        binding = self._bindings.pop(key, None)
        self._forget_warm(key)
        if binding is not None:
            self._drop_vanished(binding)
            self._released((binding,))
        return binding

    @_mutates
    def remove_kernel(self, kernel_id: str) -> tuple[Binding, ...]:
        """`unsubscribe` every replica of a kernel (shut down). Returns the bindings it held."""
        replicas = {key for key in [*self._claims, *self._bindings] if key[0] == kernel_id}
        cut = (self.unsubscribe(kernel, replica) for kernel, replica in sorted(replicas))
        return tuple(binding for binding in cut if binding is not None)

    # ---- bindings --------------------------------------------------------------------------

    @_mutates
    def commit(
        self, host_id: str, kernel_id: str, replica_id: str, cell_id: str, gpus: int
    ) -> Commitment:
        """Bind `gpus` free devices of `host_id` to cell `cell_id` of a subscribed replica.

        Device choice is deterministic: devices not lent to jobs first; among them the
        replica's own warm devices, then the fastest (`speeds`), then devices no one is warm
        on before those warm for others, each in the host's order (lowest index first).
        Committing the same cell again returns the same binding. Zero GPUs binds nothing.

        Raises `NotFound` (unknown host), `InvalidRequest` (negative count), `Conflict` (the
        replica is not subscribed on this host, or holds a binding for another cell),
        `NoCapacity` (more GPUs than the host has) or `GpusUnavailable` (too few free now).
        """
        host = self._host(host_id)
        _check_count(gpus)
        key = (kernel_id, replica_id)
        claim = self._claims.get(key)
        if claim is None or claim.host_id != host_id:
            raise Conflict(f"replica {replica_id} of kernel {kernel_id} is not on host {host_id}")
        held = self._bindings.get(key)
        if held is not None:
            if held.cell_id == cell_id and len(held.device_ids) == gpus:
                return Commitment(held)
            raise Conflict(
                f"replica {replica_id} of kernel {kernel_id} holds GPUs for cell "
                f"{held.cell_id}; release them before committing cell {cell_id}"
            )
        if gpus == 0:
            return Commitment(Binding(host_id, kernel_id, replica_id, cell_id, ()))
        if gpus > len(host.devices):
            raise NoCapacity(
                f"host {host_id} has {len(host.devices)} GPU(s); the cell needs {gpus}"
            )
        bound = self._bound_devices(host_id)
        free = [d for d in host.devices if d not in bound and d not in host.held]
        if len(free) < gpus:
            raise GpusUnavailable(
                f"host {host_id} has {len(free)} of {len(host.devices)} GPU(s) free; "
                f"the cell needs {gpus}"
            )

        speeds = self.speeds(host_id)

        def preference(device: str) -> tuple[bool, bool, float, bool]:
            owner = host.warm.get(device)
            return device in host.lent, owner != key, -speeds[device], owner is not None

        chosen = sorted(free, key=preference)[:gpus]  # sorted() is stable: host order within
        preempted = tuple(sorted({host.lent.pop(d) for d in chosen if d in host.lent}))
        displaced = sorted({host.warm[d] for d in chosen if host.warm.get(d, key) != key})
        moved = any(owner == key and d not in chosen for d, owner in host.warm.items())
        self._forget_warm(key)
        host.warm.update((device, key) for device in chosen)
        binding = Binding(host_id, kernel_id, replica_id, cell_id, tuple(chosen))
        self._bindings[key] = binding
        return Commitment(binding, tuple(displaced), moved, preempted)

    @_mutates
    def release(
        self,
        kernel_id: str,
        *,
        cell_id: str | None = None,
        replica_id: str | None = None,
        warm: bool = True,
    ) -> tuple[Binding, ...]:
        """Release the kernel's bindings (those of `cell_id` and/or `replica_id` only, if given).

        The devices are free again at once. With ``warm`` (the default) the replica's memory is
        taken to stay resident until someone else commits those devices; ``warm=False`` says it
        was offloaded already. Returns the released bindings; releasing twice is a no-op."""
        released = tuple(
            b
            for b in self._bindings.values()
            if b.kernel_id == kernel_id
            and (cell_id is None or b.cell_id == cell_id)
            and (replica_id is None or b.replica_id == replica_id)
        )
        for binding in released:
            key = (binding.kernel_id, binding.replica_id)
            del self._bindings[key]
            self._drop_vanished(binding)
            if not warm:
                self._forget_warm(key)
        self._released(released)
        return released

    @_mutates
    def mark_cold(self, kernel_id: str, replica_id: str) -> None:
        """The replica offloaded its device memory: it is warm nowhere any more."""
        self._forget_warm((kernel_id, replica_id))

    # ---- loans to background jobs ----------------------------------------------------------

    def lendable(self, host_id: str) -> tuple[str, ...]:
        """The host's devices no cell holds and no job has borrowed, in the host's order."""
        host = self._host(host_id)
        bound = self._bound_devices(host_id)
        return tuple(
            d for d in host.devices if d not in bound and d not in host.lent and d not in host.held
        )

    @_mutates
    def lend(self, host_id: str, device_ids: Iterable[str], job_id: str) -> None:
        """Lend devices to job `job_id` until `reclaim` (or a cell's `commit`) ends the loan.

        `NotFound` for an unknown host, `Conflict` if a device is not the host's, is bound to a
        cell or is lent to another job (lending a job its own devices again is a no-op)."""
        host = self._host(host_id)
        devices = tuple(device_ids)
        bound = self._bound_devices(host_id)
        for device in devices:
            if device not in host.devices:
                raise Conflict(f"host {host_id} has no device {device} to lend to job {job_id}")
            if device in bound:
                raise Conflict(f"device {device} of host {host_id} is bound to a cell")
            if device in host.held:
                raise Conflict(f"device {device} of host {host_id} is held for tool workers")
            holder = host.lent.get(device, job_id)
            if holder != job_id:
                raise Conflict(f"device {device} of host {host_id} is lent to job {holder}")
        host.lent.update((device, job_id) for device in devices)

    @_mutates
    def reclaim(self, job_id: str) -> dict[str, tuple[str, ...]]:
        """End every loan of `job_id`; returns host -> the devices it had. Idempotent."""
        ended: dict[str, tuple[str, ...]] = {}
        for host_id, host in self._hosts.items():
            devices = tuple(d for d, job in host.lent.items() if job == job_id)
            for device in devices:
                del host.lent[device]
            if devices:
                ended[host_id] = devices
        return ended

    def loans(self, job_id: str) -> dict[str, tuple[str, ...]]:
        """Host -> the devices lent to `job_id` now."""
        found = {
            host_id: tuple(d for d in host.devices if host.lent.get(d) == job_id)
            for host_id, host in self._hosts.items()
        }
        return {host_id: devices for host_id, devices in found.items() if devices}

    def lent(self, host_id: str) -> dict[str, str]:
        """Device -> job of the host's loans."""
        return dict(self._host(host_id).lent)

    def speeds(self, host_id: str) -> dict[str, float]:
        """Device -> relative speed of the host's devices (`kernelfleet.gateway.gpu_speeds`),
        derived over the whole ledger's hosts; `NotFound` for an unknown host."""
        host = self._host(host_id)
        if self._speeds is None:
            self._speeds = relative_speeds(
                {name: known.speed_bases for name, known in self._hosts.items()}
            )
        known = self._speeds.get(host_id, {})
        return {device: known.get(device, 1.0) for device in host.devices}

    # ---- holds for a cell's tool workers ---------------------------------------------------

    def holdable(self, host_id: str) -> tuple[str, ...]:
        """The host's devices no cell binds and no tool workers hold, those not lent to jobs
        first, each part in the host's order: the order `hold` should take them in."""
        host = self._host(host_id)
        bound = self._bound_devices(host_id)
        free = [d for d in host.devices if d not in bound and d not in host.held]
        return tuple(sorted(free, key=lambda d: d in host.lent))

    @_mutates
    def hold(
        self, host_id: str, device_ids: Iterable[str], kernel_id: str, group_id: str
    ) -> tuple[str, ...]:
        """Hold devices for the tool workers `group_id` of kernel `kernel_id` until `unhold`.

        Devices lent to jobs are taken from them (cells first): returns those jobs, which the
        caller stops before the workers start. `NotFound` for an unknown host, `Conflict` if
        the kernel has no claim anywhere (it runs no replica), if a device is not the host's,
        is bound to a cell or held for other workers. All or nothing."""
        host = self._host(host_id)
        devices = tuple(device_ids)
        if not any(k == kernel_id for k, _ in self._claims):
            raise Conflict(f"kernel {kernel_id} runs no replica: it cannot hold GPUs")
        bound = self._bound_devices(host_id)
        hold = WorkerHold(kernel_id, group_id)
        for device in devices:
            if device not in host.devices:
                raise Conflict(f"host {host_id} has no device {device} to hold")
            if device in bound:
                raise Conflict(f"device {device} of host {host_id} is bound to a cell")
            if host.held.get(device, hold) != hold:
                raise Conflict(f"device {device} of host {host_id} is held for other workers")
        preempted = tuple(sorted({host.lent.pop(d) for d in devices if d in host.lent}))
        host.held.update((device, hold) for device in devices)
        return preempted

    @_mutates
    def unhold(
        self, group_id: str, host_id: str | None = None, device_ids: Iterable[str] | None = None
    ) -> dict[str, tuple[str, ...]]:
        """End the holds of `group_id` (only those on `host_id`, of `device_ids`, when given:
        one worker's); returns host -> the devices they had. Idempotent."""
        only = None if device_ids is None else set(device_ids)
        return self._unhold_where(
            lambda host, device, hold: (
                hold.group_id == group_id
                and host_id in (None, host)
                and (only is None or device in only)
            )
        )

    def holds(self, group_id: str) -> dict[str, tuple[str, ...]]:
        """Host -> the devices held for `group_id` now (a host or device that went is gone)."""
        found = {
            host_id: tuple(
                d for d in host.devices if d in host.held and host.held[d].group_id == group_id
            )
            for host_id, host in self._hosts.items()
        }
        return {host_id: devices for host_id, devices in found.items() if devices}

    def held(self, host_id: str) -> dict[str, WorkerHold]:
        """Device -> the tool workers it is held for, on this host."""
        return dict(self._host(host_id).held)

    def binding(self, kernel_id: str, replica_id: str) -> Binding | None:
        return self._bindings.get((kernel_id, replica_id))

    def claim(self, kernel_id: str, replica_id: str) -> Claim | None:
        return self._claims.get((kernel_id, replica_id))

    # ---- views -----------------------------------------------------------------------------

    def view(self, host_id: str) -> HostGpuView:
        """One host's GPUs for the admin API; `NotFound` for an unknown host."""
        host = self._host(host_id)
        bound = {
            device: binding
            for binding in self._bindings.values()
            if binding.host_id == host_id
            for device in binding.device_ids
        }
        busy = {key for key, binding in self._bindings.items() if binding.host_id == host_id}
        held = sum(1 for device in host.held if device not in bound)
        subscribed = sum(
            claim.gpus
            for key, claim in self._claims.items()
            if claim.host_id == host_id and key not in busy
        )
        return HostGpuView(
            id=host_id,
            device_ids=host.devices,
            subscribed=subscribed,
            committed=sum(1 for device in bound if device in host.devices) + held,
            bound=bound,
            vanished=tuple(sorted(host.vanished)),
            warm=dict(host.warm),
            lent=dict(host.lent),
            held=dict(host.held),
        )

    def host_snapshot(self, host_id: str, alive: bool = True) -> HostSnapshot:
        """The host as policies see it: committed counts only devices the host still has, so
        ``gpus_idle`` is never negative; replicas are the host's claims, and subscribed GPUs
        the sum of all of them, running or idle (as the simulator counts, and in the unit of
        the cluster's demand GPUs); ``free_gpu_speeds`` are the relative speeds of the devices no
        cell holds (lent ones included), fastest first."""
        view = self.view(host_id)
        claims = [claim for claim in self._claims.values() if claim.host_id == host_id]
        speeds = self.speeds(host_id)
        taken = {*view.bound, *(view.held or {})}
        free = sorted((speeds[d] for d in view.device_ids if d not in taken), reverse=True)
        return HostSnapshot(
            id=host_id,
            gpus_total=view.total,
            gpus_subscribed=sum(claim.gpus for claim in claims),
            gpus_committed=view.committed,
            replicas=len(claims),
            alive=alive,
            free_gpu_speeds=tuple(free),
        )

    def snapshot(self, alive: Callable[[str], bool] | None = None) -> tuple[HostSnapshot, ...]:
        """Every host's `host_snapshot`, by id; `alive(host_id)` says which are alive."""
        return tuple(
            self.host_snapshot(host_id, alive(host_id) if alive else True)
            for host_id in sorted(self._hosts)
        )

    def totals(self) -> LedgerTotals:
        views = [self.view(host_id) for host_id in self._hosts]
        return LedgerTotals(
            total=sum(view.total for view in views),
            subscribed=sum(view.subscribed for view in views),
            demand=sum(claim.gpus for claim in self._claims.values()),
            committed=sum(view.committed for view in views),
        )

    # ---- invariants ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise `LedgerInconsistent` unless: every claim and binding is on a known host with a
        non-negative count; every binding belongs to a replica subscribed on its host, is keyed
        by its replica and binds distinct devices the host has (or lists as vanished); no device
        is bound twice; vanished devices are bound and absent from the spec; warm devices are in
        the spec and belong to subscribed replicas; held devices are in the spec, neither bound
        nor lent (a hold may outlive its kernel's claims: its workers may still run)."""
        for key, claim in self._claims.items():
            _require(key == (claim.kernel_id, claim.replica_id), f"claim {claim} filed as {key}")
            _require(claim.host_id in self._hosts, f"claim {claim} is on an unknown host")
            _require(claim.gpus >= 0, f"claim {claim} has a negative GPU count")
        holders: dict[tuple[str, str], Binding] = {}
        for key, binding in self._bindings.items():
            _require(
                key == (binding.kernel_id, binding.replica_id), f"binding {binding} filed as {key}"
            )
            host = self._hosts.get(binding.host_id)
            if host is None:
                raise _breach(f"binding {binding} is on an unknown host")
            owner = self._claims.get(key)
            _require(
                owner is not None and owner.host_id == binding.host_id,
                f"binding {binding} belongs to a replica not subscribed on its host",
            )
            _require(binding.device_ids != (), f"binding {binding} binds no device")
            _require(
                len(set(binding.device_ids)) == len(binding.device_ids),
                f"binding {binding} names a device twice",
            )
            for device in binding.device_ids:
                _require(
                    device in host.devices or device in host.vanished,
                    f"binding {binding} holds device {device}, which host {binding.host_id} "
                    f"neither has nor lists as vanished",
                )
                other = holders.setdefault((binding.host_id, device), binding)
                _require(
                    other is binding,
                    f"device {device} of host {binding.host_id} is bound twice: {other} and "
                    f"{binding}",
                )
        for host_id, host in self._hosts.items():
            for device in host.vanished:
                _require(
                    device not in host.devices,
                    f"device {device} of host {host_id} is both present and vanished",
                )
                _require(
                    (host_id, device) in holders,
                    f"device {device} of host {host_id} is listed as vanished but bound to nobody",
                )
            for device, job in host.lent.items():
                _require(
                    device in host.devices and (host_id, device) not in holders,
                    f"device {device} of host {host_id} is lent to job {job} but is "
                    + ("bound to a cell" if device in host.devices else "not in spec"),
                )
            for device, hold in host.held.items():
                _require(
                    device in host.devices
                    and (host_id, device) not in holders
                    and device not in host.lent,
                    f"device {device} of host {host_id} is held for {hold} but is "
                    + ("not in spec" if device not in host.devices else "bound or lent too"),
                )
            for device, resident in host.warm.items():
                _require(
                    device in host.devices, f"warm device {device} of host {host_id} is not in spec"
                )
                warm_claim = self._claims.get(resident)
                _require(
                    warm_claim is not None and warm_claim.host_id == host_id,
                    f"device {device} of host {host_id} is warm for {resident}, "
                    "not subscribed there",
                )

    def _audit(self, event: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self.check_invariants()
        except LedgerInconsistent as e:
            breach = str(e)
            if breach == self._breach:
                return  # still the same breach: logged and counted when it appeared
            self._breach = breach
            self.breaches += 1
            call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            log.error("after %s(%s): %s", event, call, breach)
            if self._on_breach is not None:
                try:
                    self._on_breach(breach)
                except Exception:
                    log.exception("the ledger's on_breach callback failed")
        else:
            self._breach = None

    # ---- release listeners -----------------------------------------------------------------

    def on_release(self, listener: Callable[[Binding], None]) -> None:
        """Call `listener(binding)` for every binding that leaves the ledger from now on,
        whatever the reason (its cell ended, its replica or kernel went, its host was dropped),
        just after it left. The one place every release passes: what must be undone when
        devices are released is hooked here. A listener must not change the ledger; what it
        raises is logged and swallowed."""
        self._release_listeners.append(listener)

    def _released(self, bindings: Iterable[Binding]) -> None:
        for binding in bindings:
            for listener in self._release_listeners:
                try:
                    listener(binding)
                except Exception:
                    log.exception("a release listener failed on %s", binding)

    # ---- internals -------------------------------------------------------------------------

    def _host(self, host_id: str) -> _Host:
        try:
            return self._hosts[host_id]
        except KeyError:
            raise NotFound(f"the GPU ledger has no host {host_id!r}") from None

    def _bound_devices(self, host_id: str) -> set[str]:
        return {d for b in self._bindings.values() if b.host_id == host_id for d in b.device_ids}

    def _drop_vanished(self, binding: Binding) -> None:
        host = self._hosts.get(binding.host_id)
        if host is not None:
            host.vanished.difference_update(binding.device_ids)

    def _unhold_where(
        self, ended: Callable[[str, str, WorkerHold], bool]
    ) -> dict[str, tuple[str, ...]]:
        """End the holds for which ``ended(host_id, device, hold)``; host -> their devices."""
        freed: dict[str, tuple[str, ...]] = {}
        for host_id, host in self._hosts.items():
            devices = tuple(
                d for d in host.devices if d in host.held and ended(host_id, d, host.held[d])
            )
            for device in devices:
                del host.held[device]
            if devices:
                freed[host_id] = devices
        return freed

    def _forget_warm(self, key: ReplicaKey) -> None:
        for host in self._hosts.values():
            for device in [d for d, owner in host.warm.items() if owner == key]:
                del host.warm[device]


def _check_count(gpus: int) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidRequest(f"a GPU count must be a non-negative integer, not {gpus!r}")


def _require(condition: bool, breach: str) -> None:
    if not condition:
        raise _breach(breach)


def _breach(breach: str) -> LedgerInconsistent:
    return LedgerInconsistent(f"GPU ledger invariant broken: {breach}")
