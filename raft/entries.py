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
    not sync, and why; `digests` fingerprints names that travelled in a group (see
    ``kernels.statesync``). `execution_count` is the kernel's count after the cell. Mappings are
    copied on construction; do not mutate them.
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


def first_per_key(entries: Iterable[Entry]) -> list[Entry]:
    """The entries in order, keeping only the first of each `key` (drops retried duplicates)."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for entry in entries:
        if entry.key not in seen:
            seen.add(entry.key)
            kept.append(entry)
    return kept
