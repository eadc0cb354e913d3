"""The server extension's routes, under the jupyter_server base URL."""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join

from kernelfleet.extension.events import EventsHandler
from kernelfleet.extension.handlers import FleetHandler, KernelHandler, SectionsHandler

API_PREFIX = "kernelfleet/api"


def panel_routes(base_url: str) -> list[tuple[str, Any]]:
    """``(pattern, handler)`` pairs for ``web_app.add_handlers``."""
    prefix = url_path_join(base_url, API_PREFIX)
    return [
        (url_path_join(prefix, "fleet"), FleetHandler),
        (url_path_join(prefix, "kernels", r"(?P<kernel_id>[\w-]+)"), KernelHandler),
        (url_path_join(prefix, "sections"), SectionsHandler),
        (url_path_join(prefix, "events"), EventsHandler),
    ]
