"""Who changed which GPU's clocks and power limit, and putting them back when that owner goes.

The gateway asks the agent to change GPUs' settings for an **owner**: a kernel, the ledger
binding (cell) its devices are bound to, and the replica that runs that cell. `GpuSettings`
applies the change through the host's `GpuControl` and remembers the owner, so that:

- the gateway resets them when it releases the binding (``POST /api/gpu-settings/reset``);
- the agent resets them itself when the owner's replica process is gone from this host
  (`replicas_changed`, called on every replica state change: a replica that died, was stopped,
  or never ran here);
- an agent that starts resets what a previous run left changed: every change is written to a
  small state file (``<state_dir>/gpu-settings.json``, atomically) before the call returns, and
  `restore` reads it at start.

A device already changed for another owner is reset before a new owner's change (the old one's
reset was lost); a change for a replica that does not run here is refused (`Conflict`): its
settings could never be reset by its exit.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelfleet.errors import Conflict, FleetError, InvalidRequest
from kernelfleet.kernels.agent.gpu_control import GpuControl, GpuControlFailed, Settings

log = logging.getLogger("kernelfleet.host.gpu_settings")

STATE_FILE = "gpu-settings.json"


@dataclass(frozen=True)
class Owner:
    """For whom devices were changed: ``kernel_id``, ``binding`` (the ledger's cell id for
    them, or ``session``) and, when known, ``replica_id`` (whose exit resets them)."""

    kernel_id: str
    binding: str
    replica_id: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Owner:
        if not isinstance(value, Mapping):
            raise InvalidRequest('\'owner\' must be {"kernel_id", "binding", "replica_id"?}')
        fields = {}
        for name in ("kernel_id", "binding", "replica_id"):
            item = value.get(name)
            if item is None and name == "replica_id":
                continue
            if not isinstance(item, str) or not item or len(item) > 256:
                raise InvalidRequest(f"owner's {name!r} must be a non-empty string")
            fields[name] = item
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GpuSettings:
    """The agent's GPU settings and their owners; see the module docstring.

    `control` is None on a host whose GPUs cannot be controlled (NVML did not start): every
    call then raises `GpuControlFailed` with `why`. `live_replicas()` gives the ids of the
    replicas whose processes run here (starting, ready or restarting).
    """

    def __init__(
        self,
        control: GpuControl | None,
        state_dir: Path,
        live_replicas: Callable[[], set[str]],
        why: str = "",
    ) -> None:
        self.control = control
        self.path = state_dir / STATE_FILE
        self._live_replicas = live_replicas
        self._why = why
        self._owners: dict[str, Owner] = {}

    # ---- the API ---------------------------------------------------------------------------

    def owners(self) -> list[dict[str, Any]]:
        """The devices changed now and for whom: ``[{"uuid", "kernel_id", "binding",
        "replica_id"}]``, sent with every heartbeat so the gateway resets those whose binding
        it no longer holds (a binding a restarted gateway never knew of)."""
        return [{"uuid": uuid, **owner.to_dict()} for uuid, owner in sorted(self._owners.items())]

    def control_uuids(self) -> list[str]:
        """Every device this agent can control (none without a control)."""
        return [] if self.control is None else self.control.uuids()

    def read(self, uuids: Sequence[str]) -> list[dict[str, Any]]:
        """Each device's `GpuControl.describe`, with its ``owner`` (null when unchanged)."""
        control = self._control()
        models = []
        for uuid in uuids:
            model = control.describe(uuid)
            owner = self._owners.get(uuid)
            model["owner"] = owner.to_dict() if owner else None
            models.append(model)
        return models

    def apply(
        self, uuids: Sequence[str], owner: Owner, settings: Settings, *, dry_run: bool = False
    ) -> list[dict[str, Any]]:
        """Change `uuids` for `owner` (`GpuControl.apply`: all or nothing); see the module
        docstring for devices held by another owner and replicas that do not run here."""
        control = self._control()
        if not uuids:
            raise InvalidRequest("'uuids' must name one or more of this host's GPUs")
        for uuid in uuids:
            control.device(uuid)
        if owner.replica_id is not None and owner.replica_id not in self._live_replicas():
            raise Conflict(
                f"replica {owner.replica_id} of kernel {owner.kernel_id} does not run on this "
                "host: its GPUs' settings could not be reset when it exits"
            )
        if dry_run:
            return control.apply(uuids, settings, dry_run=True)
        stale = [u for u in uuids if self._owners.get(u, owner) != owner]
        if stale:
            log.warning("GPU(s) %s still had settings of an earlier owner: resetting them first",
                        ", ".join(stale))  # fmt: skip
            self._reset(stale)
        try:
            results = control.apply(uuids, settings)
        finally:
            for uuid in uuids:
                if control.changed(uuid):
                    self._owners[uuid] = owner
            self._save()
        log.info("GPU settings %s applied on %s for kernel %s (%s)",
                 settings, ", ".join(uuids), owner.kernel_id, owner.binding)  # fmt: skip
        return results

    def reset(
        self,
        uuids: Sequence[str] | None = None,
        *,
        kernel_id: str | None = None,
        binding: str | None = None,
    ) -> list[dict[str, Any]]:
        """Reset the devices changed for `kernel_id` (and `binding`, if given), among `uuids`
        if given: `uuids` alone resets those devices whoever changed them. Devices nobody
        changed are left alone. Returns `GpuControl.reset`'s per-device calls."""
        control = self._control()
        if uuids is not None:
            for uuid in uuids:
                control.device(uuid)
        chosen = [
            uuid
            for uuid, owner in self._owners.items()
            if (uuids is None or uuid in uuids)
            and (kernel_id is None or owner.kernel_id == kernel_id)
            and (binding is None or owner.binding == binding)
        ]
        return self._reset(chosen)

    def replicas_changed(self) -> None:
        """Reset the devices of owners whose replica no longer runs here. Never raises."""
        live = self._live_replicas()
        gone = [u for u, o in self._owners.items() if o.replica_id and o.replica_id not in live]
        if not gone:
            return
        log.info("replica(s) exited: resetting the settings of GPU(s) %s", ", ".join(gone))
        try:
            self._reset(gone)
        except FleetError as e:
            log.error("could not reset GPU(s) %s after their replica exited: %s", gone, e)

    def restore(self) -> list[str]:
        """At agent start: reset what the state file says a previous run left changed; returns
        those devices. A file that cannot be read is logged and replaced. Never raises."""
        try:
            saved = json.loads(self.path.read_text())["devices"]
            left = {uuid: dict(entry["changed"]) for uuid, entry in saved.items()}
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("%s cannot be read (%s); GPUs a previous agent changed stay so", self.path, e)
            left = {}
        if self.control is None:
            log.error("GPU settings left by a previous agent cannot be reset: %s", self._why)
            return []
        known = [uuid for uuid in left if uuid in self.control.uuids()]
        for uuid in known:
            self.control.adopt(uuid, left[uuid])
        try:
            self.control.reset(known)
        except FleetError as e:
            log.error("could not reset the GPU settings a previous agent left: %s", e)
        finally:
            self._owners = {u: Owner("unknown", "previous-agent") for u in known
                            if self.control.changed(u)}  # fmt: skip
            self._save()
        if known:
            log.info("reset the GPU settings a previous agent left on %s", ", ".join(known))
        return known

    # ---- internals -------------------------------------------------------------------------

    def _control(self) -> GpuControl:
        if self.control is None:
            raise GpuControlFailed(f"this host cannot change its GPUs' settings: {self._why}")
        return self.control

    def _reset(self, uuids: list[str]) -> list[dict[str, Any]]:
        control = self._control()
        try:
            return control.reset(uuids)
        finally:
            for uuid in uuids:
                if not control.changed(uuid):
                    self._owners.pop(uuid, None)
            self._save()

    def _save(self) -> None:
        """Write what stays changed, atomically (a temporary file renamed over the old). Not
        fsynced: what it guards against is the agent's death, not the machine's (a GPU comes
        back from a reboot with its defaults)."""
        assert self.control is not None
        devices = {
            uuid: {"owner": owner.to_dict(), "changed": self.control.changed(uuid)}
            for uuid, owner in self._owners.items()
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({"devices": devices}, indent=1))
            os.replace(tmp, self.path)
        except OSError as e:
            log.error("could not write %s: %s; a restarted agent would not reset %s",
                      self.path, e, ", ".join(devices) or "anything")  # fmt: skip
