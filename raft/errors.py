"""Errors raised by the replicated log, each with a machine-readable ``reason``.

`FailReason` mirrors pysyncobj's ``FAIL_REASON`` codes (plus ``TIMEOUT``, ours) as an explicit
enum; `NotCommitted` carries one and says whether retrying may help. Retrying is always the
caller's decision: an entry whose outcome was reported as ``LEADER_CHANGED``, ``NOT_LEADER``,
``UNKNOWN_OUTCOME`` or ``TIMEOUT`` may still commit, so a retry can put it in the log twice.
"""

from __future__ import annotations

import enum

from kernelfleet.errors import FleetError, InvalidRequest


class FailReason(enum.IntEnum):
    """Why a replicated call did not commit. Values 0-7 are pysyncobj's ``FAIL_REASON``."""

    SUCCESS = 0
    QUEUE_FULL = 1
    MISSING_LEADER = 2
    DISCARDED = 3
    NOT_LEADER = 4
    LEADER_CHANGED = 5
    REQUEST_DENIED = 6
    UNKNOWN_OUTCOME = 7
    TIMEOUT = 100

    @property
    def kebab(self) -> str:
        return self.name.lower().replace("_", "-")

    @property
    def retryable(self) -> bool:
        """True where a later attempt can succeed (all but SUCCESS and REQUEST_DENIED)."""
        return self not in (FailReason.SUCCESS, FailReason.REQUEST_DENIED)

    @property
    def may_have_committed(self) -> bool:
        """True where the entry may still be in the log although the call failed."""
        return self in (
            FailReason.NOT_LEADER,
            FailReason.LEADER_CHANGED,
            FailReason.UNKNOWN_OUTCOME,
            FailReason.TIMEOUT,
        )

    @classmethod
    def from_code(cls, code: object) -> FailReason:
        """Map a pysyncobj code to a member; an unknown code reads as UNKNOWN_OUTCOME."""
        if isinstance(code, int) and code in cls._value2member_map_:
            return cls(code)
        return cls.UNKNOWN_OUTCOME


class RaftError(FleetError):
    """Base class for errors of the replicated log."""

    reason = "raft-error"


class EntryTooLarge(RaftError, InvalidRequest):
    """An entry's serialized size exceeds the log's limit; it never reached pysyncobj.

    Large values belong in the object store with only a pointer in the log.
    """

    reason = "entry-too-large"

    def __init__(self, size: int, limit: int, what: str = "entry") -> None:
        super().__init__(
            f"{what} is {size} bytes serialized, over the raft entry limit of {limit} bytes; "
            "put large values in the object store and log a pointer"
        )
        self.size = size
        self.limit = limit


class InvalidEntry(RaftError, InvalidRequest):
    """An entry's fields are malformed (wrong types, empty ids, unknown role)."""

    reason = "invalid-entry"


class EntryFormatError(RaftError):
    """A wire tuple cannot be decoded: unknown kind, newer format version, or bad shape."""

    reason = "entry-format"


class NotCommitted(RaftError):
    """A replicated call (append, membership change) did not commit; see `fail_reason`.

    ``reason`` is the kebab-case name of `fail_reason` (``leader-changed``, ``timeout``, ...).
    """

    reason = "not-committed"

    def __init__(self, fail_reason: FailReason, what: str = "append") -> None:
        detail = f"{what} not committed: {fail_reason.name}"
        if fail_reason.may_have_committed:
            detail += " (the entry may still commit; a retry may log it twice)"
        super().__init__(detail, reason=fail_reason.kebab)
        self.fail_reason = fail_reason

    @property
    def retryable(self) -> bool:
        return self.fail_reason.retryable


class LogClosed(RaftError):
    """The log was closed; calls in flight at `close()` fail with this."""

    reason = "log-closed"


class BindFailed(RaftError):
    """The raft port could not be bound (in use, or not a local address)."""

    reason = "bind-failed"


class NotReady(RaftError):
    """`wait_ready` timed out: no leader known, or this replica has not applied the log yet."""

    reason = "raft-not-ready"
