"""Typed, small, plain-data entries of a kernel's replicated log.

Every entry is a frozen dataclass with ``to_wire()`` and ``from_wire()``. The wire form is what
goes through Raft and into the journal: a tuple ``(kind, version, fields)`` of builtins only
(str, int, bytes, None, lists and dicts of those), never an object of ours, so a replica running
other code can still read the log. ``kind`` names the class; ``version`` is that kind's format
version: `decode` reads every version up to the current one and refuses newer ones with
`EntryFormatError`.

Entries stay small (KB). `encode` refuses an entry whose serialized size, as pysyncobj sends it,
is over a limit (default `MAX_ENTRY_BYTES`, 256 KiB) with `EntryTooLarge`; large values go to the
object store and the log holds only a pointer (`StateDelta.pointers`).

The log may hold an entry twice (a retried append whose first attempt committed after all):
consumers keep the first entry per `Entry.key`.
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from kernelfleet.protocol import Role
from kernelfleet.raft.errors import EntryFormatError, EntryTooLarge, InvalidEntry

MAX_ENTRY_BYTES = 256 * 1024
"""Default limit on one entry's serialized size."""

# pysyncobj pickles commands with protocol 2 (bytes >= 0x80 take two bytes there).
_PYSYNCOBJ_PICKLE_PROTOCOL = 2

Wire: TypeAlias = tuple[str, int, dict[str, Any]]


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidEntry(f"{name} must be a non-empty string, not {value!r}")
    return value


def _count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidEntry(f"{name} must be an int >= 0, not {value!r}")
    return value


def _enum(cls: type[enum.StrEnum], name: str, value: object) -> Any:
    for member in cls:
        if value == member.value:
            return member
    choices = ", ".join(member.value for member in cls)
    raise InvalidEntry(f"{name} must be one of {choices}, not {value!r}")


class _Entry:
    """Shared behaviour of the entry classes (no fields of its own)."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_wire(self) -> Wire:
        """The plain-data form that goes through Raft: ``(kind, version, fields)``."""
        return (self.KIND, self.VERSION, self._fields())

    @classmethod
    def from_wire(cls, wire: object) -> Any:
        """Decode `wire`; it must be of this class's kind (see `decode` for any kind)."""
        entry = decode(wire)
        if not isinstance(entry, cls):
            raise EntryFormatError(f"expected a {cls.KIND!r} entry, got {entry.KIND!r}")
        return entry

    @property
    def key(self) -> tuple[str, ...]:
        """Identity for de-duplication: the log keeps the first entry per key."""
        cell_id: str = getattr(self, "cell_id", "")
        replica_id: str = getattr(self, "replica_id", "")
        return (self.KIND, cell_id, replica_id)


@dataclass(frozen=True)
class Proposal(_Entry):
    """A replica proposes to LEAD (execute) or YIELD cell `cell_id` in election `attempt`.

    `attempt` numbers the elections of one cell (a failed election is retried as attempt + 1).
    """

    KIND: ClassVar[str] = "proposal"

    cell_id: str
    replica_id: str
    role: Role
    attempt: int = 0

    def __post_init__(self) -> None:
        _text("cell_id", self.cell_id)
        _text("replica_id", self.replica_id)
        object.__setattr__(self, "role", _enum(Role, "role", self.role))
        _count("attempt", self.attempt)

    def _fields(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "replica_id": self.replica_id,
            "role": self.role.value,
            "attempt": self.attempt,
        }

    @property
    def key(self) -> tuple[str, ...]:
        return (self.KIND, self.cell_id, self.replica_id, str(self.attempt))


@dataclass(frozen=True)
class StateDelta(_Entry):
    """The executor's namespace changes after cell `cell_id`, applied by followers in log order.

    `changed` maps names (or comma-joined groups of names that share objects) to small pickled
    values; `pointers` maps them to object-store keys (values too large for the log); `deleted`
    lists removed names; `imports` maps names to module names; `problems` names values that do
    not sync, and why; `digests` maps the names sent to the executor's fingerprint of each
    (see ``kernels.replica.statesync_fingerprint``). `execution_count` is the kernel's count
    after the cell. Mappings are copied on construction; do not mutate them.
    """

    KIND: ClassVar[str] = "state-delta"

    cell_id: str
    replica_id: str
    changed: Mapping[str, bytes] = field(default_factory=dict)
    pointers: Mapping[str, str] = field(default_factory=dict)
    deleted: tuple[str, ...] = ()
    execution_count: int = 0
    imports: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    digests: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _text("cell_id", self.cell_id)
        _text("replica_id", self.replica_id)
        for name in ("imports", "problems", "digests"):
            mapping = dict(getattr(self, name))
            for key, value in mapping.items():
                _text(f"{name} name", key)
                if not isinstance(value, str):
                    raise InvalidEntry(f"{name}[{key!r}] must be a string, not {type(value)}")
            object.__setattr__(self, name, mapping)
        changed = dict(self.changed)
        for name, value in changed.items():
            _text("changed name", name)
            if not isinstance(value, bytes):
                raise InvalidEntry(f"changed[{name!r}] must be bytes (a pickle), not {type(value)}")
        pointers = dict(self.pointers)
        for name, key in pointers.items():
            _text("pointer name", name)
            _text(f"pointers[{name!r}]", key)
        if isinstance(self.deleted, str):
            raise InvalidEntry("deleted must be a list of names, not a string")
        deleted = tuple(self.deleted)
        for name in deleted:
            _text("deleted name", name)
        object.__setattr__(self, "changed", changed)
        object.__setattr__(self, "pointers", pointers)
        object.__setattr__(self, "deleted", deleted)
        _count("execution_count", self.execution_count)

    def _fields(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "replica_id": self.replica_id,
            "changed": dict(self.changed),
            "pointers": dict(self.pointers),
            "deleted": list(self.deleted),
            "execution_count": self.execution_count,
            "imports": dict(self.imports),
            "problems": dict(self.problems),
            "digests": dict(self.digests),
        }


@dataclass(frozen=True)
class UnknownEntry(_Entry):
    """A committed wire tuple this code cannot decode (a newer kind or version, or a removed
    kind); kept as is so that log indexes stay aligned. Never appended by this code."""

    KIND: ClassVar[str] = "unknown"

    wire: Any
    error: str

    def _fields(self) -> dict[str, Any]:
        raise EntryFormatError("an UnknownEntry cannot be re-encoded")

    def to_wire(self) -> Wire:
        raise EntryFormatError("an UnknownEntry cannot be re-encoded")


# The kinds "vote", "completion" and "membership" were removed (no replica ever appended one);
# a journal holding one still replays, that entry as an `UnknownEntry`.
Entry: TypeAlias = Proposal | StateDelta
_KINDS: dict[str, type[Entry]] = {cls.KIND: cls for cls in (Proposal, StateDelta)}
KNOWN_KINDS = frozenset(_KINDS)
"""The entry kinds this code decodes."""


def decode(wire: object) -> Entry:
    """Decode a wire tuple (or list, as JSON gives it) into its entry class.

    Raises `EntryFormatError` for a bad shape, an unknown kind or a newer version, and
    `InvalidEntry` for bad field values.
    """
    if not isinstance(wire, tuple | list) or len(wire) != 3:
        raise EntryFormatError(f"an entry is a (kind, version, fields) triple, not {wire!r:.80}")
    kind, version, fields = wire
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EntryFormatError(f"unknown entry kind {kind!r}")
    if not isinstance(version, int) or not 1 <= version <= cls.VERSION:
        raise EntryFormatError(
            f"{kind} entry format version {version!r} is not supported (this code reads "
            f"versions 1 to {cls.VERSION})"
        )
    if not isinstance(fields, dict):
        raise EntryFormatError(f"{kind} entry fields must be a dict")
    try:
        return cls(**fields)
    except TypeError as error:
        raise EntryFormatError(f"{kind} entry fields do not match: {error}") from None


def decode_or_unknown(wire: object) -> Entry | UnknownEntry:
    """`decode`, but an undecodable wire tuple becomes an `UnknownEntry` instead of raising."""
    try:
        return decode(wire)
    except (EntryFormatError, InvalidEntry) as error:
        return UnknownEntry(wire=wire, error=str(error))


def wire_size(wire: Wire) -> int:
    """Bytes the wire tuple takes pickled as pysyncobj pickles it (the journal's record size)."""
    return len(pickle.dumps(wire, protocol=_PYSYNCOBJ_PICKLE_PROTOCOL))


def encode(entry: Entry, max_bytes: int = MAX_ENTRY_BYTES) -> Wire:
    """The wire form of `entry`, or `EntryTooLarge` if it is over `max_bytes` serialized.

    Called on the caller's thread before anything reaches pysyncobj. A StateDelta whose raw
    values alone exceed the limit is refused without being pickled.
    """
    if not isinstance(entry, tuple(_KINDS.values())):
        raise InvalidEntry(f"not a log entry: {type(entry).__name__}")
    what = f"{entry.KIND} entry"
    if isinstance(entry, StateDelta):
        raw = sum(len(value) for value in entry.changed.values())
        if raw > max_bytes:
            raise EntryTooLarge(raw, max_bytes, what)
    wire = entry.to_wire()
    size = wire_size(wire)
    if size > max_bytes:
        raise EntryTooLarge(size, max_bytes, what)
    return wire


class DeltaOrder:
    """Which committed `StateDelta` entries take effect, decided from the log alone (so every
    replica, and a replica replaying a pruned log, decides alike). Feed it every committed
    LEAD (`lead`) and delta (`admit`) in log order.

    A replica whose LEAD for a cell committed owes that cell's delta. Its delta takes effect
    only while it is still owed:
    - a second copy (a retried append whose first attempt committed after all, possibly after
      later cells' deltas) is not owed any more: applied again, it would roll every name it
      sets back to its cell's value, and ok cells' effects would vanish without a word;
    - once a replica that led a later cell publishes, whatever other replicas owed from before
      its LEAD is given up: it ran its cell without that state (`OWED_DELTA_WAIT` in the
      replica), so that delta must not land on top of its cell's effects later;
    - once the replica leads another cell, its older delta is owed no more: when its publish
      failed, its next delta carries those changes;
    - once a later attempt of the cell is led (the gateway sent it again, giving up on the
      earlier executor), or the cell is settled (`Role.SETTLE`: the gateway told the client
      how it ended), what earlier executors owed for it is given up; a LEAD of an earlier
      attempt that commits after that owes nothing.
    A delta whose LEAD this order never saw (pruned from a compacted log) takes effect unless
    its execution count is below one admitted before it (counts only grow along a log); the
    compaction keeps the newest entries (`LogConfig.keep_recent_entries`) so that a late delta
    always finds its LEAD. Remembers the last `remembered` cells.
    """

    def __init__(self, remembered: int = 10_000) -> None:
        self.completed: dict[str, int] = {}
        """Cell id -> the execution count of its delta that took effect, oldest first."""
        self.leads: dict[tuple[str, int], str] = {}
        """(cell id, attempt) -> the replica whose LEAD committed first, oldest first."""
        self.first_leads: dict[str, str] = {}
        """Cell id -> the replica whose LEAD of any attempt committed first, oldest first."""
        self.owed: dict[str, tuple[str, int]] = {}
        """Replica -> (the cell whose delta it owes, the index of that LEAD)."""
        self.attempts: dict[str, int] = {}
        """Cell id -> the latest attempt led (the newest cell last)."""
        self.highest = 0
        self._remembered = remembered

    def lead(self, index: int, cell_id: str, attempt: int, replica_id: str) -> bool:
        """Record a committed LEAD at log `index`; False for a copy or a rival of one seen
        (the replica will not run the cell: it owes nothing)."""
        key = (cell_id, attempt)
        if key in self.leads:
            return False
        self._remember(self.leads, key, replica_id)
        if cell_id not in self.first_leads:
            self._remember(self.first_leads, cell_id, replica_id)
        if attempt < self.attempts.get(cell_id, -1) or cell_id in self.completed:
            return False  # superseded already, or led again after it ran: refused
        self._remember(self.attempts, cell_id, attempt)
        self.settle(cell_id)
        self.owed[replica_id] = (cell_id, index)
        return True

    def settle(self, cell_id: str) -> None:
        """Give up whatever is owed for `cell_id` (a later attempt's LEAD, or a SETTLE)."""
        for replica_id, (cell, _) in list(self.owed.items()):
            if cell == cell_id:
                del self.owed[replica_id]

    def admit(self, cell_id: str, replica_id: str, execution_count: int) -> bool:
        """Whether this committed delta takes effect; records it if it does."""
        if cell_id in self.completed:
            return False
        owed = self.owed.get(replica_id)
        if owed is None:  # its LEAD is unknown (pruned), or it was paid or given up on
            if cell_id in self.first_leads or execution_count < self.highest:
                return False
        elif owed[0] != cell_id:
            return False  # the replica led another cell since
        else:
            del self.owed[replica_id]
            for other, (_, index) in list(self.owed.items()):
                if index < owed[1]:
                    del self.owed[other]  # given up on when this replica ran its cell
        self._remember(self.completed, cell_id, execution_count)
        self.highest = max(self.highest, execution_count)
        return True

    def _remember(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        table[key] = value
        while len(table) > self._remembered:
            del table[next(iter(table))]


def first_per_key(entries: Iterable[Entry]) -> list[Entry]:
    """The entries in order, keeping only the first of each `key` (drops retried duplicates)."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for entry in entries:
        if entry.key not in seen:
            seen.add(entry.key)
            kept.append(entry)
    return kept
