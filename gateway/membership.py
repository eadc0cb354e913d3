"""A gateway as one member of a replicated group: standby until it leads, then it serves.

Three gateways (``--group-members``) form a Raft group (`kernelfleet.raft.files`). Its leader
serves the whole API; the others are standbys that answer every request with 503
``{"reason": "not-serving", "serving": <the serving member's URL or null>}`` and run nothing
else. Everything a serving gateway writes to its state folder (the kernels, the warm pool, the
jobs: every `kernelfleet.gateway.store.write_json_atomically`) is committed to the group first
(`mirror_writes`), so a standby that takes over starts from the same state, through the same
path as a gateway restarted on its folder: it adopts the kernels as their hosts report.

A member that stops leading (it lost its majority, or another member was elected) must not
serve another request from its in-memory state: it replaces itself (`os.execv`, the same
command line) with a fresh process that comes back as a standby. A member cut off from the
majority stops leading within the group's leader fallback (1.5 s); its writes cannot commit
meanwhile. From the first failed write or the loss of leadership, whichever comes first, it
answers every write 503 `not-serving`, and restarts `STEP_DOWN_GRACE_S` later, once the
requests in flight had their answer. A majority that goes on without it never sees those
writes. (As with any Raft write whose commit was not confirmed, one may still take effect if
this member's log is the one the group keeps when it rejoins, say if it is elected again: the
503 says so.)
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import tornado.httpserver
import tornado.netutil
import tornado.web

from kernelfleet.errors import NotServing
from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.gateway.store import mirror_writes, write_bytes_atomically
from kernelfleet.raft.errors import NotCommitted, RaftError
from kernelfleet.raft.files import ReplicatedFiles
from kernelfleet.web import ApiHandler, KernelAccess, log_request, request_summary

log = logging.getLogger("kernelfleet.gateway.membership")

_PASSWORD_LABEL = b"kernelfleet gateway group v1"
LEADERSHIP_POLL_S = 0.1
"""How often a standby checks whether it leads, and a serving member that it still does."""
STEP_DOWN_GRACE_S = 2.0
"""A member that stops leading refuses every write at once (503 `not-serving`), and restarts as
a standby this much later, so the requests in flight are answered, not cut."""
_LOST_MAJORITY = (
    "this gateway lost its group's majority and no longer serves: what was asked takes effect "
    "only if the group later keeps this gateway's log, so check before retrying; another member "
    "serves within seconds"
)
WRITE_TIMEOUT_S = 3.0
"""A state write that has not committed by then (no majority) makes the member step down. A
write blocks the gateway's loop until it commits: milliseconds on a LAN."""


def group_password(fleet_token: str) -> str:
    """The gateway group's Raft password, derived from the fleet token every member holds."""
    return hmac.new(fleet_token.encode(), _PASSWORD_LABEL, hashlib.sha256).hexdigest()


class GatewayMember:
    """This gateway's place in its group: `standby` until it leads, then `serve_from` its
    state folder, and `hold` the leadership while it serves."""

    def __init__(
        self, address: str, members: list[str], url: str, token: str, state_dir: Path
    ) -> None:
        if address not in members:
            raise ValueError(f"--group-address {address} is not among --group-members {members}")
        if len(members) < 3 or len(members) % 2 == 0:
            raise ValueError(
                f"a gateway group needs an odd number of members, at least 3 (got {len(members)})"
            )
        self.url = url
        self.token = token
        self.state_dir = state_dir
        self.files = ReplicatedFiles(
            address, members, password=group_password(token), data_dir=state_dir / "group"
        )
        self.term = 0
        self._stepping_down = False

    def serving_url(self) -> str | None:
        """The URL of the member that claimed to serve in the current term, if any."""
        claim = self.files.serving
        if claim is None or claim[1] != self.files.term:
            return None
        return claim[0]

    async def standby(self, ip: str, port: int, listening: Callable[[int], None]) -> None:
        """Answer 503 on `ip`:`port` until this member leads and its claim to serve commits,
        then close the port for the gateway to bind. `listening` is told the port (the one
        picked for 0) once it listens."""
        sockets = tornado.netutil.bind_sockets(port, ip)
        port = sockets[0].getsockname()[1]
        listening(port)
        app = tornado.web.Application(
            [(r".*", NotServingHandler)],
            token=self.token,
            kernel_token_check=KernelTokens(self.token).verify,
            member=self,
            log_function=log_standby_request,
        )
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        log.info("gateway member %s stands by on port %d", self.files.address, port)
        try:
            self.term = await self._claim()
        finally:
            server.stop()
            await server.close_all_connections()
        log.info("gateway member %s serves from term %d", self.files.address, self.term)

    async def _claim(self) -> int:
        while True:
            if self.files.is_leader:
                try:
                    return await asyncio.to_thread(self.files.claim, self.url)
                except NotCommitted as e:
                    log.info("claim to serve did not commit (%s); still standing by", e)
            await asyncio.sleep(LEADERSHIP_POLL_S)

    def serve_from(self) -> None:
        """Write the group's files into the state folder, then replicate every later write
        there (`mirror_writes`): call once this member serves, before the gateway reads it."""
        files = self.files.files()
        root = self.state_dir.resolve()
        for name, data in files.items():
            path = (root / name).resolve()
            if not path.is_relative_to(root):
                log.error("group file %r is outside the state folder: not written", name)
                continue
            write_bytes_atomically(path, data)
        log.info("state from the group: %s", ", ".join(sorted(files)) or "(none yet)")
        mirror_writes(self.state_dir, self._replicate)

    def _replicate(self, name: str, data: bytes) -> None:
        if self._stepping_down:
            raise NotServing(_LOST_MAJORITY)
        try:
            self.files.write(name, data, timeout=WRITE_TIMEOUT_S)
        except RaftError as e:
            self._lose(f"the write of {name} did not commit ({e})")
            raise NotServing(_LOST_MAJORITY) from e

    async def hold(self) -> None:
        """While this member leads in the term it claimed, wait; once it does not, `_lose`."""
        while True:
            await asyncio.sleep(LEADERSHIP_POLL_S)
            if not self.files.is_leader or self.files.term != self.term:
                self._lose(f"it no longer leads the group (term {self.files.term})")
                return

    def _lose(self, why: str) -> None:
        """Refuse every write from now on, and `step_down` once the requests in flight had
        `STEP_DOWN_GRACE_S` to be answered."""
        if self._stepping_down:
            return
        self._stepping_down = True
        log.warning("gateway member %s refuses writes: %s", self.url, why)
        try:
            asyncio.get_running_loop().call_later(STEP_DOWN_GRACE_S, self.step_down, why)
        except RuntimeError:  # no loop runs here: nothing waits for an answer
            self.step_down(why)

    def step_down(self, why: str) -> NoReturn:
        """Replace this process with a fresh one, which starts as a standby: nothing this
        gateway holds in memory may serve another request (exit 75 if it cannot)."""
        log.warning("gateway member %s stops serving: %s; restarting as a standby", self.url, why)
        logging.shutdown()
        try:
            os.execv(sys.executable, sys.orig_argv)
        except OSError as e:
            sys.stderr.write(f"cannot restart as a standby ({e}); exiting\n")
            os._exit(75)


class NotServingHandler(ApiHandler):
    """Every request to a standby: 503, naming the member that serves, if one does."""

    kernel_access = {method: KernelAccess.ANY for method in ApiHandler.SUPPORTED_METHODS}

    def _not_serving(self, *args: Any, **kwargs: Any) -> None:
        member: GatewayMember = self.settings["member"]
        self.write_json(
            {
                "reason": "not-serving",
                "message": "this gateway is a standby member of its group; ask the one serving",
                "serving": member.serving_url(),
            },
            status=503,
        )

    get = post = put = patch = delete = options = _not_serving


def log_standby_request(handler: tornado.web.RequestHandler) -> None:
    """A standby's access log: its 503s (the proxy probes every member several times a
    second) at DEBUG; anything else as every request (`kernelfleet.web.log_request`)."""
    if handler.get_status() == 503:
        log.debug("503 %s (standing by)", request_summary(handler.request))
    else:
        log_request(handler)
