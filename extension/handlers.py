"""The server extension's API for the JupyterLab panel, under ``{base_url}kernelfleet/api/``.

Every route sits behind jupyter_server's own authentication and authorization (resource
``kernels``), and calls the gateway server-side (`kernelfleet.extension.gateway_api`): the
browser never sees the gateway token. A browser user sees only the kernels of this
jupyter_server (those in its kernel manager) and the fleet as a whole.

- ``GET fleet``: ``{"fleet": GET /api/fleet, "hosts": GET /api/fleet/hosts, "jobs": GET
  /api/fleet/jobs}`` (``jobs`` null from a gateway without background jobs).
- ``GET kernels/{id}``: the gateway's kernel model (``GET /api/fleet/kernels/{id}``).
- ``GET sections?kernel=ID``: installed tools' panel sections (`kernelfleet.extension.sections`).
- ``GET events?kernel=ID&since=SEQ`` (websocket): `kernelfleet.extension.events`.

Errors are JSON ``{"reason", "message"}``: 404 ``not-found`` for a kernel that is not this
server's, 409 ``not-kernelfleet`` when the server does not run in gateway mode, 502
``gateway-unreachable`` (naming the gateway's URL) when the gateway does not answer, and the
gateway's own status and reason when it answers with an error.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from kernelfleet.errors import FleetError, InvalidRequest, NotFound
from kernelfleet.extension.gateway_api import (
    GatewayAnswered,
    GatewayUnreachable,
    NotKernelfleet,
    gateway,
    get_json,
)
from kernelfleet.extension.sections import SectionContext, load_sections, render_all

AUTH_RESOURCE = "kernels"
"""The panel shows kernels: whoever may read this server's kernels may read their fleet view."""


def status_for(error: FleetError) -> int:
    if isinstance(error, GatewayAnswered):
        return error.status
    if isinstance(error, GatewayUnreachable):
        return 502
    if isinstance(error, NotKernelfleet):
        return 409
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, InvalidRequest):
        return 400
    return 500


def visible_kernel(handler: JupyterHandler, kernel_id: str) -> None:
    """`NotFound` unless `kernel_id` is a kernel this jupyter_server started (or adopted)."""
    if kernel_id not in handler.kernel_manager:
        raise NotFound(f"kernel {kernel_id} is not a kernel of this Jupyter server")


class PanelApiHandler(APIHandler):
    """JSON in, JSON out; a `FleetError` becomes ``{"reason", "message"}`` with its status."""

    auth_resource = AUTH_RESOURCE

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, FleetError):
            reason, message = exc.reason, exc.message
        elif isinstance(exc, web.HTTPError):
            reason = {403: "forbidden", 404: "not-found"}.get(status_code, "http-error")
            message = exc.log_message or self._reason
        else:
            reason, message = "internal-error", "the kernelfleet server extension failed"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"reason": reason, "message": message}))

    def fail(self, error: FleetError) -> None:
        if isinstance(error, GatewayUnreachable):
            self.log.warning("kernelfleet: %s", error.message)
        self.set_status(status_for(error))
        self.write_error(status_for(error), exc_info=(type(error), error, None))

    def write_json(self, body: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


async def fleet_and_hosts() -> dict[str, Any]:
    fleet, hosts, jobs = await asyncio.gather(
        get_json("/api/fleet"), get_json("/api/fleet/hosts"), background_jobs()
    )
    return {"fleet": fleet, "hosts": hosts, "jobs": jobs}


async def background_jobs() -> dict[str, Any] | None:
    """``GET /api/fleet/jobs`` (the job policy and every job); None from a gateway without
    background jobs (it answers 404)."""
    try:
        jobs: dict[str, Any] = await get_json("/api/fleet/jobs")
    except GatewayAnswered as error:
        if error.status == 404:
            return None
        raise
    return jobs


class FleetHandler(PanelApiHandler):
    """``GET fleet``: the fleet summary, every host's GPUs (committed / subscribed / total, and
    which are lent to jobs) and the background jobs."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            self.write_json(await fleet_and_hosts())
        except FleetError as error:
            self.fail(error)


class KernelHandler(PanelApiHandler):
    """``GET kernels/{id}``: the gateway's model of one of this server's kernels."""

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        try:
            gateway()
            visible_kernel(self, kernel_id)
            self.write_json(await get_json(f"/api/fleet/kernels/{kernel_id}"))
        except FleetError as error:
            self.fail(error)


class SectionsHandler(PanelApiHandler):
    """``GET sections?kernel=ID``: every installed panel section, rendered for that kernel."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        kernel_id = self.get_argument("kernel", None) or None
        try:
            gateway()
            kernel = None
            if kernel_id is not None:
                visible_kernel(self, kernel_id)
                kernel = await get_json(f"/api/fleet/kernels/{kernel_id}")
            context = SectionContext(kernel_id, kernel, await get_json("/api/fleet"))
        except FleetError as error:
            self.fail(error)
            return
        sections = self.settings.get("kernelfleet_panel_sections")
        if sections is None:  # loaded once, at the first request
            sections = self.settings["kernelfleet_panel_sections"] = load_sections()
        self.write_json(await render_all(sections, context))
