"""Gateway errors JupyterLab can read.

jupyter_server (2.x) turns a gateway's error answer into a ``tornado.web.HTTPError`` whose
message is a template, ``"Error from Gateway: [%s] %s. Ensure gateway url is valid and the
Gateway instance is running."``, with the gateway's message and reason as its arguments. Its API
handlers answer that template unfilled, so JupyterLab's "Error Starting Kernel" dialog shows
``Error from Gateway: [%s] %s`` for a kernel the fleet refused (e.g. ``never-fits``: more GPUs
than any host has), and never the reason. `ReadableErrorsKernelManager` answers with the
gateway's own words instead: ``<message> [<reason>]`` for a refusal (4xx), the filled template
for anything else.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jupyter_server.gateway.managers import GatewayKernelManager
from tornado import web

T = TypeVar("T")


def readable(error: web.HTTPError) -> web.HTTPError:
    """`error` with its message filled in (unchanged if it has no template arguments)."""
    if not error.args or not error.log_message:
        return error
    refused = 400 <= error.status_code < 500 and len(error.args) == 2
    text = f"{error.args[0]} [{error.args[1]}]" if refused else error.get_message() or ""
    # (jupyter_server answers ``log_message``, in which tornado doubles a '%': a rare sight)
    return web.HTTPError(error.status_code, text, reason=error.reason)


def _mended(call: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(call)
    async def mended(*args: Any, **kwargs: Any) -> T:
        try:
            return await call(*args, **kwargs)
        except web.HTTPError as e:
            fixed = readable(e)
            if fixed is e:
                raise
            raise fixed from e.__cause__

    return mended


class ReadableErrorsKernelManager(GatewayKernelManager):
    """jupyter_server's gateway kernel manager, whose start, restart, interrupt and shutdown
    fail with the gateway's own words (`readable`)."""

    start_kernel = _mended(GatewayKernelManager.start_kernel)
    restart_kernel = _mended(GatewayKernelManager.restart_kernel)
    interrupt_kernel = _mended(GatewayKernelManager.interrupt_kernel)
    shutdown_kernel = _mended(GatewayKernelManager.shutdown_kernel)
