"""Forming and repairing a kernel's Raft group, and the other requests the gateway sends a
replica (`kernelfleet.protocol.Request`).

The gateway is not a member of the group. To form one it sends every replica `Request.JOIN`
(shell channel), all in parallel, and returns once each answered that its group has a leader.
To replace a lost replica it asks a live member to swap the addresses (`Request.MEMBERSHIP`,
control channel), then joins the newcomer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from kernelfleet.errors import KernelStartFailed
from kernelfleet.gateway.channels import replica_session
from kernelfleet.gateway.framing import parse_kernel_frames
from kernelfleet.protocol import (
    BindContent,
    ConnectionInfo,
    ForgetContent,
    JoinContent,
    MembershipContent,
    OutcomeContent,
    Request,
)

OUTCOME_TIMEOUT = 15.0
"""Seconds a live replica has to say whether a lost executor's cell completed (it commits an
entry first: after a leader loss, that includes an election)."""


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
    existing: tuple[str, ...] = (),
    forget: tuple[str, ...] = (),
) -> None:
    """Join every member to the group (whose other members are at `existing` addresses);
    `KernelStartFailed` names the replica that could not."""
    addresses = [*existing, *(member.raft_address for member in members)]
    await asyncio.gather(
        *(
            _join(context, member, addresses, password, store_root, timeout, forget)
            for member in members
        )
    )


async def _join(
    context: zmq.asyncio.Context,
    member: Member,
    addresses: list[str],
    password: str,
    store_root: str,
    timeout: float,
    forget: tuple[str, ...],
) -> None:
    content = JoinContent(
        replica_id=member.replica_id,
        address=member.raft_address,
        peers=[address for address in addresses if address != member.raft_address],
        password=password,
        store_root=store_root,
        timeout=timeout,
        forget=list(forget),
    )
    what = f"replica {member.replica_id} joining its Raft group"
    await send_request(context, member.connection, Request.JOIN, content, timeout, what)


async def ask_outcome(
    context: zmq.asyncio.Context, info: ConnectionInfo, cell_id: str, attempt: int
) -> dict[str, Any]:
    """Ask the live replica at `info` whether cell `cell_id`, whose executor was lost,
    completed (`Request.OUTCOME`): ``{"completed", "execution_count"}``; `KernelStartFailed`
    when it cannot tell (no majority to commit its barrier within `OUTCOME_TIMEOUT`)."""
    content = OutcomeContent(cell_id=cell_id, attempt=attempt)
    what = f"asking whether cell {cell_id} completed"
    return await send_request(context, info, Request.OUTCOME, content, OUTCOME_TIMEOUT, what)


async def change_members(
    context: zmq.asyncio.Context,
    through: Member,
    remove: list[str],
    add: list[str],
    timeout: float,
) -> list[str]:
    """Have member `through` remove then add Raft addresses; returns the members it sees."""
    content = MembershipContent(remove=remove, add=add)
    what = f"replica {through.replica_id} changing its group (-{remove} +{add})"
    reply = await send_request(
        context, through.connection, Request.MEMBERSHIP, content, timeout, what
    )
    return list(reply.get("members", []))


async def send_request(
    context: zmq.asyncio.Context,
    connection: ConnectionInfo,
    request: Request,
    content: (
        JoinContent
        | MembershipContent
        | ForgetContent
        | OutcomeContent
        | BindContent
        | dict[str, Any]
    ),
    timeout: float,
    what: str,
) -> dict[str, Any]:
    """Send `request` on its channel and return the content of its reply;
    `KernelStartFailed` saying `what` failed if the reply is late or not ok."""
    session = replica_session(connection)
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(connection.url(request.channel))
    try:
        message = session.msg(request.value, dict(content))
        await socket.send_multipart(session.serialize(message))
        while True:
            frames = await asyncio.wait_for(socket.recv_multipart(), timeout)
            reply = parse_kernel_frames(frames, session.auth)
            if reply.msg_type == request.reply:
                break
    except TimeoutError:
        raise KernelStartFailed(f"{what}: no answer within {timeout:.0f} s") from None
    finally:
        socket.close()
    answer: dict[str, Any] = json.loads(reply.raw_content)
    if answer.get("status") != "ok":
        raise KernelStartFailed(f"{what} failed: {answer.get('ename')}: {answer.get('evalue')}")
    return answer
