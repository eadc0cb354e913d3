"""The fleet admin API (JSON, same token): hosts and kernels as the platform sees them.

Field names are a stable contract read by tools outside the project. A kernel-scoped token
(`kernelfleet.gateway.kernel_tokens`) may read the fleet, its hosts and this description, and
read, move and set the GPUs of its own kernel: each handler's ``kernel_access`` says so.
"""

from __future__ import annotations

import time
from typing import Any

from tornado import web

from kernelfleet import __version__
from kernelfleet.errors import InvalidRequest
from kernelfleet.gateway.handlers.base import GatewayHandler
from kernelfleet.gateway.hosts import HostState
from kernelfleet.gateway.openapi import spec
from kernelfleet.web import KernelAccess, is_kernel_token, token_from_request, token_matches

_ANY = KernelAccess.ANY
_OWN = KernelAccess.OWN


def host_models(handler: GatewayHandler) -> dict[str, dict[str, Any]]:
    """Every host's admin model by id, GPU counts taken from the same snapshot policies see,
    and the isolation and container engine its agent last reported (null if it never said)."""
    views = {view.id: view for view in handler.kernels.snapshot().hosts}
    return {
        host.id: {
            "id": host.id,
            "address": host.address,
            "state": host.liveness,
            "kind": host.kind,
            "gpus": {
                "total": views[host.id].gpus_total,
                "subscribed": views[host.id].gpus_subscribed,
                "committed": views[host.id].gpus_committed,
                **vanished_gpus(handler, host.id),
                "type": host.gpu_type,
                "devices": device_models(handler, host.id),
            },
            "isolation": host.isolation,
            "drain": handler.settings["host_drains"].model(host.id),
            "containers": None
            if host.containers is None
            else {
                "engine": host.containers.engine,
                "reachable": host.containers.reachable,
                "why": host.containers.why or None,
            },
        }
        for host in handler.hosts.all()
    }


def vanished_gpus(handler: GatewayHandler, host_id: str) -> dict[str, Any]:
    """Devices the host no longer reports but running cells still hold until they end
    (``vanished``); the host is ``over_committed`` while there are any."""
    ledger = handler.kernels.ledger
    vanished = list(ledger.view(host_id).vanished) if host_id in ledger.hosts() else []
    return {"vanished": vanished, "over_committed": bool(vanished)}


def device_models(handler: GatewayHandler, host_id: str) -> list[dict[str, Any]]:
    """The host's devices, each with the background job it is lent to (``lent_to_job``: a job
    id, or null), the tool workers it is held for (``held_for_workers``: ``{"kernel_id",
    "group_id"}``, or null), its ``fingerprint`` as its agent reported it (null if none) and the
    ``relative_speed`` the gateway derived from it (`kernelfleet.gateway.gpu_speeds`)."""
    ledger = handler.kernels.ledger
    if host_id not in ledger.hosts():
        return []
    lent, speeds, held = ledger.lent(host_id), ledger.speeds(host_id), ledger.held(host_id)
    reported = {
        str(gpu.get("index")): gpu.get("fingerprint")
        for gpu in handler.hosts.get(host_id).gpus
        if isinstance(gpu, dict)
    }
    return [
        {
            "id": d,
            "lent_to_job": lent.get(d),
            "held_for_workers": (
                {"kernel_id": held[d].kernel_id, "group_id": held[d].group_id}
                if d in held
                else None
            ),
            "relative_speed": speeds[d],
            "fingerprint": reported.get(d),
        }
        for d in ledger.view(host_id).device_ids
    ]


def fleet_model(handler: GatewayHandler) -> dict[str, Any]:
    """``GET /api/fleet``: what the gateway runs (its version, scheduling policy and replicas
    per replicated kernel) and a summary of the fleet. Host counts are by state; GPU counts sum
    the ``alive`` hosts' (what ``GET /api/fleet/hosts`` lists per host). ``autoscaling`` is the
    autoscaler's `Autoscaler.model`, or None when it does not run (yet)."""
    hosts = list(host_models(handler).values())
    alive = [host for host in hosts if host["state"] == HostState.ALIVE.value]
    return {
        "version": __version__,
        "policy": handler.settings["policy"],
        "replicas": handler.settings["replicas"],
        "hosts": {
            "alive": len(alive),
            "lost": sum(1 for host in hosts if host["state"] == HostState.LOST.value),
        },
        "gpus": {
            field: sum(host["gpus"][field] for host in alive)
            for field in ("total", "subscribed", "committed")
        },
        "kernels": len(handler.kernels.all()),
        "jobs": handler.settings["job_service"].summary(),
        "autoscaling": handler.settings.get("autoscaling", lambda: None)(),
    }


class FleetHandler(GatewayHandler):
    kernel_access = {"GET": _ANY}

    def get(self) -> None:
        self.write_json(fleet_model(self))


class ServingHandler(GatewayHandler):
    """``GET /api/fleet/serving``: 200 from a gateway that serves (a standby answers 503 from
    `kernelfleet.gateway.membership.NotServingHandler`); what the gateway proxy probes."""

    kernel_access = {"GET": _ANY}

    def get(self) -> None:
        term, member = self.settings["serving"]()
        self.write_json({"serving": True, "term": term, "member": member})


class FleetHostsHandler(GatewayHandler):
    kernel_access = {"GET": _ANY}

    def get(self) -> None:
        self.write_json(list(host_models(self).values()))


class FleetHostDrainHandler(GatewayHandler):
    """An operator's drain of a host (`kernelfleet.gateway.host_drains`): the fleet token only."""

    def post(self, host_id: str) -> None:
        why = self.json_body().get("why", "asked by an operator")
        if not isinstance(why, str) or not why.strip():
            raise InvalidRequest("'why' must be a non-empty string, if given")
        self.settings["host_drains"].start(host_id, why.strip())
        self.write_json(host_models(self)[host_id], status=202)

    def delete(self, host_id: str) -> None:
        self.settings["host_drains"].reopen(host_id)
        self.write_json(host_models(self)[host_id])


class FleetHostHandler(GatewayHandler):
    kernel_access = {"GET": _ANY}  # a heartbeat (PUT) is the host agents' alone

    def get(self, host_id: str) -> None:
        self.hosts.get(host_id)  # NotFound for unknown ids
        self.write_json(host_models(self)[host_id])

    def check_token(self) -> None:
        """A heartbeat takes the fleet token only: any other is 401 (a kernel token 403), and
        the gateway logs the first one from each agent (`HostRegistry.refuse_token`), not every
        beat."""
        presented = token_from_request(self.request)
        if (
            self.request.method == "PUT"
            and not token_matches(presented, self.settings["token"])
            and not is_kernel_token(presented)  # a kernel's: 403, as on every admin route
        ):
            host_id = self.path_kwargs.get("host_id", "?")
            self.hosts.refuse_token(host_id, self.request.remote_ip or "?")
            raise web.HTTPError(
                401, "not the fleet token: start the agent with the gateway's token"
            )
        super().check_token()

    def put(self, host_id: str) -> None:
        """A host agent's registration and heartbeat (one idempotent call); 409 if another
        live agent is this host (`HostRegistry.report`)."""
        with self.kernels.metrics.host_report.time():
            host = self.hosts.report(host_id, self.json_body(), now=time.monotonic())
        self.write_json({"id": host.id, "state": host.liveness})


class FleetKernelsHandler(GatewayHandler):
    def get(self) -> None:
        self.write_json([kernel.fleet_model() for kernel in self.kernels.all()])


class FleetKernelHandler(GatewayHandler):
    kernel_access = {"GET": _OWN}

    def get(self, kernel_id: str) -> None:
        self.write_json(self.kernels.get(kernel_id).fleet_model())


class ReplicaMigrateHandler(GatewayHandler):
    """``POST .../replicas/{replica_id}/migrate`` with an optional ``{"host": id}``."""

    async def post(self, kernel_id: str, replica_id: str) -> None:
        host = self.json_body().get("host")
        if host is not None and not isinstance(host, str):
            raise InvalidRequest("'host' must be a host id")
        kernel = await self.kernels.migrate(kernel_id, replica_id, host)
        self.write_json(kernel.fleet_model())


class KernelMigrateHandler(GatewayHandler):
    """``POST /api/fleet/kernels/{id}/migrate`` with an optional ``{"host": id}``: move the
    kernel's executor replica (`KernelService.migrate_kernel`): 200 once moved, 202 when it
    moves after the kernel's running cell (the case of ``%fleet migrate``)."""

    kernel_access = {"POST": _OWN}

    async def post(self, kernel_id: str) -> None:
        host = self.json_body().get("host")
        if host is not None and not isinstance(host, str):
            raise InvalidRequest("'host' must be a host id")
        moved = await self.kernels.migrate_kernel(kernel_id, host)
        self.write_json(moved, 202 if moved["state"] == "scheduled" else 200)


class KernelGpusHandler(GatewayHandler):
    """``PUT /api/fleet/kernels/{id}/gpus`` with ``{"gpus": N}``: the kernel's GPU count for
    its later cells (`KernelService.set_gpus`); answers the kernel's model."""

    kernel_access = {"PUT": _OWN}

    def put(self, kernel_id: str) -> None:
        body = self.json_body()
        if "gpus" not in body:
            raise InvalidRequest('the body must be {"gpus": N}')
        self.write_json(self.kernels.set_gpus(kernel_id, body["gpus"]).fleet_model())


class OpenApiHandler(GatewayHandler):
    """``GET /api/fleet/openapi.json``: the admin API's OpenAPI 3 description, its ``servers``
    naming this gateway as the request reached it, so tools can call it back."""

    kernel_access = {"GET": _ANY}

    def get(self) -> None:
        self.write_json(spec(f"{self.request.protocol}://{self.request.host}"))
