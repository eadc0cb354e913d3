"""Forming a kernel's Raft group: every replica is told its peers and joins.

The gateway is not a member of the group. It sends each replica a ``kernelfleet_join_request``
on the shell channel (see ``kernels.replicated``), all in parallel, and returns once every
replica answered that its group has a leader.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass

import zmq
import zmq.asyncio

from kernelfleet.errors import KernelStartFailed
from kernelfleet.gateway.channels import ConnectionInfo
from kernelfleet.gateway.framing import parse_kernel_frames


@dataclass(frozen=True)
class Member:
    """One replica as the join needs it."""

    replica_id: str
    raft_address: str
    connection: ConnectionInfo


def new_group_password() -> str:
    """A fresh secret for one group's Raft traffic (pysyncobj encrypts with it)."""
    return secrets.token_urlsafe(24)


async def join_group(
    context: zmq.asyncio.Context,
    members: list[Member],
    password: str,
    store_root: str,
    timeout: float,
) -> None:
    """Join every member to the group; `KernelStartFailed` names the replica that could not."""
    addresses = [member.raft_address for member in members]
    await asyncio.gather(
        *(_join(context, member, addresses, password, store_root, timeout) for member in members)
    )


async def _join(
    context: zmq.asyncio.Context,
    member: Member,
    addresses: list[str],
    password: str,
    store_root: str,
    timeout: float,
) -> None:
    session = member.connection.session()
    content = {
        "replica_id": member.replica_id,
        "address": member.raft_address,
        "peers": [address for address in addresses if address != member.raft_address],
        "password": password,
        "store_root": store_root,
        "timeout": timeout,
    }
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(member.connection.url("shell"))
    try:
        request = session.msg("kernelfleet_join_request", content=content)
        await socket.send_multipart(session.serialize(request))
        while True:
            frames = await asyncio.wait_for(socket.recv_multipart(), timeout)
            reply = parse_kernel_frames(frames, session.auth)
            if reply.msg_type == "kernelfleet_join_reply":
                break
    except TimeoutError:
        raise KernelStartFailed(
            f"replica {member.replica_id} did not join its Raft group within {timeout:.0f} s"
        ) from None
    finally:
        socket.close()
    answer = json.loads(reply.raw_content)
    if answer.get("status") != "ok":
        raise KernelStartFailed(
            f"replica {member.replica_id} could not join its Raft group: "
            f"{answer.get('ename')}: {answer.get('evalue')}"
        )
