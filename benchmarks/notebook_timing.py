"""A notebook run end to end through nbclient against a jupyter_server, split into its phases.

The client is the same for every server: nbclient with kernelfleet's `FleetKernelManager` (a
jupyter_server `GatewayKernelManager` that sends the token on its websocket), pointed at the
server's URL. A server with local kernels and one relaying to the kernelfleet gateway expose the
same REST and websocket API, so only where the kernel runs differs.

Phases, from nbclient's own hooks:
  start     ``async_execute`` called -> kernel started and its client ready (``on_notebook_start``)
  cells     -> the last cell executed (``on_cell_executed``), kernel_info request included
  shutdown  -> the kernel shut down and the client stopped (``async_execute`` returned)

and each code cell's own time (``on_cell_start`` to ``on_cell_executed``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import nbformat
from jupyter_server.gateway.gateway_client import GatewayClient
from nbclient import NotebookClient

from kernelfleet.extension.gateway_client import FleetKernelManager

PHASES = ("start_s", "cells_s", "shutdown_s", "total_s")


def point_at(url: str, token: str) -> None:
    """Make jupyter_server's process-wide gateway client (what `FleetKernelManager` uses) talk
    to the server at `url`. ``ws_url`` is set too: its default is derived once, from the first
    URL."""
    client = GatewayClient.instance()
    client.url = url
    client.ws_url = url.replace("http", "ws", 1)
    client.auth_token = token


async def run_notebook(path: Path, url: str, token: str, timeout: float = 600) -> dict[str, Any]:
    """Run every cell of the notebook at `path` on a new kernel of the server at `url`; the
    seconds each phase took, and how many code cells ran. A failing cell raises nbclient's
    ``CellExecutionError``."""
    point_at(url, token)
    notebook = nbformat.read(path, as_version=4)
    marks: dict[str, float] = {}
    cell_s: list[float] = []

    def mark(name: str) -> Any:
        return lambda **_: marks.__setitem__(name, time.perf_counter())

    def cell_executed(**_: Any) -> None:
        marks["cells_done"] = time.perf_counter()
        cell_s.append(marks["cells_done"] - marks["cell_start"])

    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=FleetKernelManager,
        on_notebook_start=mark("ready"),
        on_cell_start=mark("cell_start"),
        on_cell_executed=cell_executed,
    )
    started = time.perf_counter()
    await client.async_execute()
    ended = time.perf_counter()
    code_cells = sum(1 for cell in notebook.cells if cell.cell_type == "code")
    if code_cells != client.code_cells_executed:
        raise RuntimeError(f"{path.name}: {client.code_cells_executed} of {code_cells} cells ran")
    return {
        "start_s": marks["ready"] - started,
        "cells_s": marks["cells_done"] - marks["ready"],
        "shutdown_s": ended - marks["cells_done"],
        "total_s": ended - started,
        "code_cells": code_cells,
        "cell_s": cell_s,
    }
