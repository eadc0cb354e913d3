"""Replication over pysyncobj: a typed replicated log per kernel.

- `entries`: the small, plain-data entry types and their wire form (size-limited).
- `log`: `KernelLog`, a replica's Raft node with an asyncio API.
"""

from kernelfleet.raft.config import LogConfig
from kernelfleet.raft.entries import (
    MAX_ENTRY_BYTES,
    Entry,
    Proposal,
    Role,
    StateDelta,
    UnknownEntry,
    decode,
    encode,
)
from kernelfleet.raft.errors import (
    BindFailed,
    EntryFormatError,
    EntryTooLarge,
    FailReason,
    InvalidEntry,
    LogClosed,
    NotCommitted,
    NotReady,
    RaftError,
)
from kernelfleet.raft.log import KernelLog

__all__ = [
    "MAX_ENTRY_BYTES",
    "BindFailed",
    "Entry",
    "EntryFormatError",
    "EntryTooLarge",
    "FailReason",
    "InvalidEntry",
    "KernelLog",
    "LogClosed",
    "LogConfig",
    "NotCommitted",
    "NotReady",
    "Proposal",
    "RaftError",
    "Role",
    "StateDelta",
    "UnknownEntry",
    "decode",
    "encode",
]
