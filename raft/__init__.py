"""Replication over pysyncobj: a typed replicated log per kernel.

- `entries`: the small, plain-data entry types and their wire form (size-limited).
- `log`: `KernelLog`, a replica's Raft node with an asyncio API.
- `config`, `errors`: its tunables and its domain errors.

This package exports what the replica (``kernels.replica.kernel``) uses; everything else is
imported from its module.
"""

from kernelfleet.raft.entries import Proposal, Role, StateDelta
from kernelfleet.raft.errors import NotCommitted
from kernelfleet.raft.log import KernelLog

__all__ = ["KernelLog", "NotCommitted", "Proposal", "Role", "StateDelta"]
