"""Talking to one replica of a fleet kernel directly, past the gateway: its connection info
comes from its host agent, then jupyter_client (a cell) or the gateway's own status request
(`kernelfleet.protocol.Request.STATUS`) reach it on its ZMQ channels."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any, cast

import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo

from kernelfleet.gateway.replication import send_request
from kernelfleet.kernels.agent.client import HostAgentClient
from kernelfleet.protocol import ConnectionInfo, Request
from kernelfleet.testing.fleet import Fleet

log = logging.getLogger(__name__)

DIGEST = (
    "print(__import__('kernelfleet.kernels.replica.statesync', fromlist=['namespace_digest'])"
    ".namespace_digest(get_ipython().user_ns, get_ipython().kernel.group.tracker))"
)
"""A cell that prints the digest of the replica's namespace (equal on replicas in step)."""


async def replica_connection(fleet: Fleet, replica: dict[str, Any]) -> dict[str, Any]:
    """The connection info of `replica` (a model from ``/api/fleet/kernels/<id>``), as its
    host agent gives it."""
    hosts = {host["id"]: host["address"] for host in fleet.api("GET", "/api/fleet/hosts")}
    agent = HostAgentClient(hosts[replica["host"]], fleet.token)
    try:
        connection: dict[str, Any] = (await agent.get_replica(replica["id"]))["connection"]
        return connection
    finally:
        agent.close()


async def execute_on(
    fleet: Fleet, replica: dict[str, Any], code: str, timeout: float = 30
) -> tuple[dict[str, Any], str]:
    """Run `code` on one replica, bypassing the gateway: (the reply's content, its stdout;
    its stderr is logged)."""
    client = AsyncKernelClient()
    connection = await replica_connection(fleet, replica)
    client.load_connection_info(cast(KernelConnectionInfo, connection))
    client.start_channels()
    try:
        output: dict[str, list[str]] = {"stdout": [], "stderr": []}

        def hook(msg: dict[str, Any]) -> None:
            if msg["header"]["msg_type"] == "stream":
                output.setdefault(msg["content"]["name"], []).append(msg["content"]["text"])

        reply = await client.execute_interactive(code, timeout=timeout, output_hook=hook)
        if output["stderr"]:
            log.warning("replica %s wrote on stderr: %s", replica["id"], "".join(output["stderr"]))
        return reply["content"], "".join(output["stdout"])
    finally:
        client.stop_channels()


async def replica_digest(fleet: Fleet, replica: dict[str, Any]) -> str:
    """The digest of one replica's namespace (`DIGEST`); fails the test if the cell fails."""
    content, output = await execute_on(fleet, replica, DIGEST)
    assert content["status"] == "ok", content
    return output.strip()


async def replica_status(fleet: Fleet, replica: dict[str, Any]) -> dict[str, Any]:
    """The replica's own view of its Raft group and of who ran which cell (control channel)."""
    info = ConnectionInfo.from_dict(await replica_connection(fleet, replica))
    context = zmq.asyncio.Context()
    try:
        return await send_request(context, info, Request.STATUS, {}, 10, "status")
    finally:
        context.destroy(linger=0)


async def agreed_executors(
    fleet: Fleet,
    replicas: Callable[[], list[dict[str, Any]]],
    cells: Collection[str],
    timeout: float = 15,
) -> dict[str, str]:
    """``{cell: executor}`` once every replica that `replicas()` names (asked again on each
    round) records an executor for each of `cells` and they all agree."""
    views: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = []
        for replica in replicas():
            status = await replica_status(fleet, replica)
            views.append({cell: who for cell, _, who in status["executors"] if cell in cells})
        if all(len(view) == len(cells) for view in views) and all(v == views[0] for v in views):
            return views[0]
        await asyncio.sleep(0.3)
    raise AssertionError(f"the replicas disagree or miss cells: {views}")
