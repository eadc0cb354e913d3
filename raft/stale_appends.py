"""Keep a follower from truncating entries it already acknowledged when a stale append arrives.

pysyncobj's follower, given an ``append_entries`` whose ``prevLogIdx`` lies below its last
entry, deletes every entry after ``prevLogIdx`` before appending the message's entries, whether
or not they conflict (Raft deletes only from the first conflicting entry). Such a message is
ordinary: a leader that processes a late ``next_node_idx`` reply (a second "reset" for an index
the follower has since passed) sends again from that index, and a long message may carry fewer
entries than the follower holds. The follower then lacks entries it has acknowledged, and its
leader may have counted them towards a commit: if the leader dies before it sends them again,
the follower can win an election without them, and a committed entry (a cell's state delta
that a user saw succeed) is gone. pysyncobj logs this as CRITICAL "truncating
already-applied log entries"; tests/raft/test_stale_appends.py loses committed entries this way
on an in-memory network that delays and repeats messages.

The guard rewrites such a message before pysyncobj sees it, when every entry the follower holds
after ``prevLogIdx`` has the message's term. Those entries were made by the sender itself (one
leader per term; only a term's leader creates entries of that term) and a leader never removes
its own entries, so they are the sender's entries at the same indexes, and whatever the message
carries is already there. The message becomes an empty append after the follower's last entry,
which pysyncobj accepts without deleting anything: it replies success up to that entry (true:
the logs match there) and takes the commit index up to it (true for the same reason). A message
from another term, one that does not reach below the follower's end, or the first pieces of a
chunked entry (which pysyncobj holds without touching the log) pass unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.transport import TCPTransport

TermAt = Callable[[int], "int | None"]


def as_heartbeat_if_redundant(message: Any, last_index: int, term_at: TermAt) -> Any:
    """`message` unchanged, or, when it is an append that would truncate only entries of its
    own term, an empty append after `last_index` (the follower's last entry). `term_at(i)` is
    the term of the follower's entry at index `i`, or None if it holds none there."""
    if not isinstance(message, dict) or message.get("type") != "append_entries":
        return message
    prev_index = message.get("prevLogIdx")
    if not isinstance(prev_index, int) or prev_index >= last_index:
        return message
    if message.get("transmission") not in (None, "finish"):
        return message
    term = message.get("term")
    if any(term_at(index) != term for index in range(prev_index + 1, last_index + 1)):
        return message
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": message.get("commit_index"),
        "entries": [],
        "prevLogIdx": last_index,
        "prevLogTerm": term_at(last_index),
    }


def follower_log_view(sync_obj: SyncObj) -> tuple[int, TermAt]:
    """The last index of `sync_obj`'s Raft log and a term lookup over it (tick thread only:
    pysyncobj's log is not locked)."""
    log = sync_obj._SyncObj__raftLog
    first_index = log[0][1]

    def term_at(index: int) -> int | None:
        position = index - first_index
        if position < 0 or position >= len(log):
            return None
        return log[position][2]

    return log[-1][1], term_at


class GuardedTCPTransport(TCPTransport):
    """pysyncobj's TCP transport, with stale appends rewritten on arrival (module docstring).

    Messages arrive on the tick thread, the one that runs pysyncobj, so the log read here is
    the one the message will meet."""

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            last_index, term_at = follower_log_view(self._syncObj)
            message = as_heartbeat_if_redundant(message, last_index, term_at)
        super()._onMessageReceived(node, message)
