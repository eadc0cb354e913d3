"""Waiting on one kernel process that a host agent launched: until it answers, or exits.

A replica's kernel is ready once it answers ``kernel_info``; it failed to start if its process
exits first, if its log says a port was taken (ipykernel then hangs rather than exit), or if
neither happens in time. `wait_ready` raises `StartError` saying which.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from typing import Any

from jupyter_client.manager import AsyncKernelManager

PORT_TAKEN = "Address already in use"


class StartError(Exception):
    """Why a kernel did not become ready (the replica table turns it into ``KernelStartFailed``)."""


async def process_exit_code(km: AsyncKernelManager) -> int | None:
    """The process's exit code, or None while it runs (or if it was never launched)."""
    provisioner = km.provisioner
    if provisioner is None or not provisioner.has_process:
        return None
    code = await provisioner.poll()
    return code if isinstance(code, int) else None


async def _wait_exit(km: AsyncKernelManager, interval: float = 0.05) -> int | None:
    while True:
        code = await process_exit_code(km)
        if code is not None:
            return code
        await asyncio.sleep(interval)


async def _kernel_info_answered(kc: Any) -> None:
    """Ask for ``kernel_info`` (again each second) until the kernel replies.

    Not ``wait_for_ready``: that also waits for IOPub and restarts after 0.2 s of silence there,
    which costs a quarter of a second per start; the gateway confirms IOPub itself when it links.
    """
    while True:
        msg_id = kc.kernel_info()
        try:
            while (await kc.get_shell_msg(timeout=1.0))["parent_header"].get("msg_id") != msg_id:
                pass
            return
        except queue.Empty:
            continue


async def wait_ready(
    km: AsyncKernelManager, ready_within: float, log_text: Callable[[], str] = str
) -> None:
    """Return once the kernel answered ``kernel_info``; raise ``StartError`` as soon as the
    process exits, its log (`log_text`) says a port was taken (ipykernel then hangs rather
    than exit), or when ``ready_within`` seconds pass."""
    kc = km.client()
    kc.start_channels()
    ready = asyncio.ensure_future(_kernel_info_answered(kc))
    exited = asyncio.ensure_future(_wait_exit(km))
    port_taken = asyncio.ensure_future(_wait_for_text(log_text, PORT_TAKEN))
    try:
        done, _ = await asyncio.wait(
            {ready, exited, port_taken}, timeout=ready_within, return_when=asyncio.FIRST_COMPLETED
        )
        if ready in done and ready.exception() is None:
            return
        if port_taken in done:
            raise StartError(f"could not bind its ports ({PORT_TAKEN})")
        code = await process_exit_code(km)
        if code is not None:
            raise StartError(f"exited with code {code} before it was ready")
        if ready in done:
            raise StartError(f"did not become ready: {ready.exception()}")
        raise StartError(f"did not answer kernel_info within {ready_within:g} s")
    finally:
        for task in (ready, exited, port_taken):
            task.cancel()
        await asyncio.gather(ready, exited, port_taken, return_exceptions=True)
        kc.stop_channels()


async def _wait_for_text(text: Callable[[], str], wanted: str, interval: float = 0.2) -> None:
    """Return once `wanted` appears in `text()` (a log file written by another process, so
    polled: nothing in this process could signal it)."""
    while True:
        if wanted in text():
            return
        await asyncio.sleep(interval)
