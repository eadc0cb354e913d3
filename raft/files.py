"""A replicated set of small files: the state a group of gateways shares.

Each member of the group runs one `ReplicatedFiles` node. The leader writes a file with
`write` (the whole content, by name); the call returns once a majority holds it, and every
member applies it in log order. Only the leader writes (pysyncobj would forward a follower's
call to the leader), and a write made in an older term than the last claim is dropped, so a
deposed leader can never overwrite what its successor serves from. `claim` commits an entry
naming the member that serves: once it returns on a new leader, every write committed before
it has been applied on that node, so what `files` returns is the group's whole state.

The journal and dump live in `data_dir`, so a member (or the whole group) restarted on the same
folder comes back with the files. All traffic is encrypted and authenticated with `password`,
as for a kernel's group (`kernelfleet.raft.log`).

The methods block the calling thread while the tick thread (pysyncobj's own) does the work; they
are short (one commit) and meant for a caller that must not go on before the state is durable.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from kernelfleet.raft.config import LogConfig
from kernelfleet.raft.errors import BindFailed, FailReason, NotCommitted
from kernelfleet.raft.log import check_address

logger = logging.getLogger("kernelfleet.raft.files")

GROUP_CONFIG = LogConfig(
    min_timeout=0.5,
    max_timeout=1.0,
    heartbeat=0.1,
    leader_fallback=1.5,
    compaction_min_entries=200,
    compaction_min_time=60.0,
    commands_wait_leader=False,
)
"""Gateway groups elect within about a second of silence and a leader cut off from the majority
steps down within 1.5 s; dumps are small (the files themselves), so they are written often."""


class _Files(SyncObjConsumer):
    """The replicated state: file contents by name, and the member that last claimed to
    serve with the term it claimed in."""

    def __init__(self) -> None:
        super().__init__()
        self.contents: dict[str, bytes] = {}
        self.serving: tuple[str, int] | None = None

    @replicated
    def put(self, name: str, data: bytes, term: int) -> bool:
        """Keep `data` unless a member claimed to serve in a later term than the writer's
        (a deposed leader's write, forwarded or late, is dropped on every node alike)."""
        if self.serving is not None and term < self.serving[1]:
            return False
        self.contents[name] = data
        return True

    @replicated
    def claim(self, member: str, term: int) -> None:
        self.serving = (member, term)


class ReplicatedFiles(SyncObj):
    """One member's node of a gateway group (see the module docstring).

    `address` and `peers` are ``host:port`` raft addresses (`address` may be among `peers`).
    Construction binds the raft port (`BindFailed` if it cannot) and returns at once.
    """

    def __init__(
        self,
        address: str,
        peers: Iterable[str],
        *,
        password: str,
        data_dir: str | Path,
        config: LogConfig = GROUP_CONFIG,
    ) -> None:
        if not password:
            raise ValueError("a gateway group needs a non-empty password")
        check_address(address)
        others = sorted({check_address(peer) for peer in peers} - {address})
        data_path = Path(data_dir)
        data_path.mkdir(parents=True, exist_ok=True)
        self._address = address
        self._files = _Files()
        conf = config.syncobj_conf(
            address=address,
            password=password,
            data_dir=data_path,
            on_ready=lambda: None,
            on_state_changed=lambda old, new: None,
        )
        super().__init__(address, others, conf=conf, consumers=[self._files])
        try:
            self.waitBinded()
        except SyncObjException:
            self.close()
            raise BindFailed(f"cannot bind the gateway group's raft address {address}") from None
        logger.info("gateway group member %s started with peers %s", address, others)

    @property
    def address(self) -> str:
        return self._address

    @property
    def is_leader(self) -> bool:
        return bool(self._isLeader())

    @property
    def leader(self) -> str | None:
        """The ``host:port`` of the member this node takes for the leader, if any."""
        node = self._getLeader()
        return None if node is None else str(node.id)

    @property
    def term(self) -> int:
        return int(self.raftCurrentTerm)

    @property
    def serving(self) -> tuple[str, int] | None:
        """(member, term) of the last committed claim to serve."""
        return self._files.serving

    def files(self) -> dict[str, bytes]:
        """Every file the group holds, as applied on this node."""
        return dict(self._files.contents)

    def write(self, name: str, data: bytes, timeout: float = 5.0) -> None:
        """Replicate `data` as file `name`; returns once a majority holds it. `NotCommitted`
        if this node does not lead, if it did not commit in `timeout` (lost majority), or if
        a member claimed to serve in a later term (``REQUEST_DENIED``)."""
        what = f"write of {name}"
        if not self.is_leader:
            raise NotCommitted(FailReason.NOT_LEADER, what)
        if not self._commit(self._files.put, (name, data, self.term), timeout, what):
            raise NotCommitted(FailReason.REQUEST_DENIED, what)

    def claim(self, member: str, timeout: float = 5.0) -> int:
        """Commit that `member` serves from the current term, and return that term; once this
        returns, every earlier write is applied here. `NotCommitted` as for `write`."""
        term = self.term
        self._commit(self._files.claim, (member, term), timeout, "claim to serve")
        return term

    def _commit(self, method: object, args: tuple[object, ...], timeout: float, what: str) -> Any:
        try:
            return method(*args, sync=True, timeout=timeout)  # type: ignore[operator]
        except SyncObjException as e:
            code = e.errorCode
            reason = FailReason.TIMEOUT if code == "Timeout" else FailReason.from_code(code)
            raise NotCommitted(reason, what) from None

    def close(self) -> None:
        """Stop the node and release its port before returning (its tick thread ended)."""
        if self.tick_thread_alive():
            self.destroy_synchronous()
        else:
            self._doDestroy()
