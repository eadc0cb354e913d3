"""GPU clocks and power limits for a kernel's running cell, through its host's agent.

``GET/PUT/DELETE /api/fleet/kernels/{id}/gpu-settings`` act only on the devices the GPU ledger
has bound to that kernel (a running cell's binding, or a per-session one): the gateway finds the
binding, turns its device ids into the host's GPU UUIDs and asks the host agent
(`HostAgentClient.set_gpu_settings`), naming the owner (kernel, binding, replica) so the agent
can reset them on its own when that replica exits.

Settings never outlive the binding: the service listens to the ledger (`GpuLedger.on_release`),
the one place every release passes (the cell ended, the kernel was shut down, its replica was
lost, its host was dropped), and has the agent reset the devices it changed. The agent resets
them too when the replica's process exits, and at its own start for what a previous run left.
Last, every heartbeat says which devices the agent holds changed for whom; one whose binding
the ledger does not hold (any more: a cell of a gateway that restarted, whose bindings the new
one never had) is reset too (`on_host_report`).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kernelfleet.errors import Conflict, FleetError, InvalidRequest
from kernelfleet.gateway.background import Background
from kernelfleet.gateway.hosts import HostRecord, HostRegistry
from kernelfleet.gateway.ledger import GpuLedger
from kernelfleet.gateway.ledger_records import Binding, ReplicaKey
from kernelfleet.gateway.records import KernelRecord

log = logging.getLogger("kernelfleet.gateway.gpu_settings")

KNOBS = ("gpu_clock_mhz", "mem_clock_mhz", "power_limit_w")
"""What ``PUT`` may set (the host agent checks each value against the device's ranges)."""


class NoGpusBound(Conflict):
    """No running cell of the kernel holds GPUs, so there is nothing whose settings to read or
    change."""

    reason = "no-gpus-bound"


class KernelLookup(Protocol):
    """What the service needs from the kernel service: its kernels and its GPU ledger."""

    @property
    def ledger(self) -> GpuLedger: ...

    def get(self, kernel_id: str) -> KernelRecord: ...


class GpuSettingsService:
    """See the module docstring. Built once by the gateway app; from then on it listens to
    the ledger's releases and to the hosts' reports."""

    def __init__(self, kernels: KernelLookup, hosts: HostRegistry) -> None:
        self._kernels = kernels
        self._hosts = hosts
        self._ledger = kernels.ledger
        self._changed: dict[ReplicaKey, Binding] = {}
        """The bindings whose devices were changed through this service and not reset."""
        self._background = Background()
        self._resetting: set[tuple[str, str, str]] = set()
        """(host, kernel, binding) whose reset is under way."""
        self._ledger.on_release(self.released)
        hosts.observe(self)

    # ---- the API ---------------------------------------------------------------------------

    async def read(self, kernel_id: str) -> dict[str, Any]:
        """``GET``: the bound devices' current, default and changed settings and ranges."""
        binding, host, uuids = self._bound(kernel_id)
        devices = await host.client.gpu_settings(uuids)
        keep = ("uuid", "index", "current", "default", "ranges", "changed")
        return {
            **self._where(binding),
            "devices": [{key: device[key] for key in keep} for device in devices],
        }

    async def change(self, kernel_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT``: set the knobs `body` gives on every bound device, all or nothing."""
        unknown = sorted(set(body) - {*KNOBS, "dry_run"})
        if unknown:
            raise InvalidRequest(
                f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}, dry_run"
            )
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidRequest("'dry_run' must be true or false")
        settings = {knob: body[knob] for knob in KNOBS if body.get(knob) is not None}
        binding, host, uuids = self._bound(kernel_id)
        key = (binding.kernel_id, binding.replica_id)
        if not dry_run:
            self._changed[key] = binding
        devices = await host.client.set_gpu_settings(
            uuids, self._owner(binding), settings, dry_run=dry_run
        )
        if not dry_run and self._ledger.binding(*key) != binding:
            self._changed.pop(key, None)  # released while the agent was at it: undo it now
            await self._reset(binding)
            raise NoGpusBound(f"kernel {kernel_id}'s cell ended while its GPUs were being set")
        return {**self._where(binding), "dry_run": dry_run, "devices": devices}

    async def reset(self, kernel_id: str) -> None:
        """``DELETE``: the bound devices back to their defaults now. A kernel whose cells hold
        no GPUs has nothing changed (a release resets): nothing to do."""
        self._kernels.get(kernel_id)  # NotFound for an unknown kernel
        try:
            binding, _host, _uuids = self._bound(kernel_id)
        except NoGpusBound:
            return
        self._changed.pop((binding.kernel_id, binding.replica_id), None)
        await self._reset(binding, quiet=False)

    # ---- releases --------------------------------------------------------------------------

    def released(self, binding: Binding) -> None:
        """The ledger released `binding`: have its host's agent reset what was changed on its
        devices (in the background; a failure is logged, and the agent resets them anyway once
        the replica exits)."""
        key = (binding.kernel_id, binding.replica_id)
        if self._changed.get(key) == binding:
            del self._changed[key]
            self._background.run(self._reset(binding))

    def on_host_report(self, host: HostRecord, restarted: bool) -> None:
        """Reset what `host` reports changed for a binding the ledger does not hold now."""
        for owner in host.gpu_settings:
            kernel_id, binding_id = owner.get("kernel_id"), owner.get("binding")
            replica_id = owner.get("replica_id")
            if not isinstance(kernel_id, str) or not isinstance(binding_id, str):
                continue
            held = (
                self._ledger.binding(kernel_id, replica_id) if isinstance(replica_id, str) else None
            )
            if held is not None and held.cell_id == binding_id and held.host_id == host.id:
                continue
            if (host.id, kernel_id, binding_id) in self._resetting:
                continue
            log.info("host %s holds GPU settings of kernel %s (%s), which no longer has that "
                     "binding: resetting them", host.id, kernel_id, binding_id)  # fmt: skip
            stale = Binding(host.id, kernel_id, str(replica_id), binding_id, ())
            self._background.run(self._reset(stale))

    def on_host_lost(self, host: HostRecord) -> None:
        """Nothing to do: the ledger released its bindings (`released`)."""

    # ---- internals -------------------------------------------------------------------------

    def _bound(self, kernel_id: str) -> tuple[Binding, HostRecord, list[str]]:
        """The kernel's binding with devices, its host, and the devices' UUIDs there;
        `NotFound` (unknown kernel) or `NoGpusBound`."""
        kernel = self._kernels.get(kernel_id)
        for replica in kernel.replicas:
            binding = self._ledger.binding(kernel.id, replica.id)
            if binding is not None and binding.device_ids:
                break
        else:
            raise NoGpusBound(
                f"no running cell of kernel {kernel_id} holds GPUs: clocks and power limits "
                "are set for the GPUs of a running cell (a `%%gpus N` cell, or a kernel with "
                "KERNEL_GPUS), from that cell"
            )
        host = self._hosts.get(binding.host_id)
        by_index = {str(gpu.get("index")): gpu.get("uuid") for gpu in host.gpus}
        uuids = [by_index.get(device) for device in binding.device_ids]
        if not all(isinstance(uuid, str) for uuid in uuids):
            raise Conflict(
                f"host {host.id} no longer reports device(s) {', '.join(binding.device_ids)}"
            )
        return binding, host, [str(uuid) for uuid in uuids]

    @staticmethod
    def _where(binding: Binding) -> dict[str, Any]:
        return {"kernel_id": binding.kernel_id, "host_id": binding.host_id,
                "cell_id": binding.cell_id}  # fmt: skip

    @staticmethod
    def _owner(binding: Binding) -> dict[str, str]:
        return {"kernel_id": binding.kernel_id, "binding": binding.cell_id,
                "replica_id": binding.replica_id}  # fmt: skip

    async def _reset(self, binding: Binding, quiet: bool = True) -> None:
        """Ask the binding's host to reset what was changed for it. `quiet`: log a failure
        instead of raising it (a release: the host may be lost)."""
        key = (binding.host_id, binding.kernel_id, binding.cell_id)
        self._resetting.add(key)
        try:
            await self._ask_reset(binding, quiet)
        finally:
            self._resetting.discard(key)

    async def _ask_reset(self, binding: Binding, quiet: bool) -> None:
        try:
            host = self._hosts.get(binding.host_id)
            done = await host.client.reset_gpu_settings(
                kernel_id=binding.kernel_id, binding=binding.cell_id
            )
        except FleetError as e:
            if not quiet:
                raise
            log.warning("could not reset the GPU settings of kernel %s on host %s: %s "
                        "(its agent resets them when the replica exits)",
                        binding.kernel_id, binding.host_id, e)  # fmt: skip
            return
        if done:
            log.info("GPU settings of kernel %s (%s) reset on host %s",
                     binding.kernel_id, binding.cell_id, binding.host_id)  # fmt: skip
