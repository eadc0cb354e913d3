"""What of a kernel's replicated entry list a replica still needs, and what it no longer does.

Pure functions over the list of committed ``(index, wire)`` pairs (see `entries` for the wire
form); no I/O, no clock. `KernelLog` uses `prune` inside a replicated call, so every replica
prunes the same list at the same log position and the lists stay equal; pysyncobj's full dump
(its log compaction) then holds only what `prune` kept, and a replica that joins late gets that
snapshot instead of a replay of every cell. `live_keys` tells the object-store collector which
stored values the namespace still points to.

What a replica needs to rebuild the namespace. A `StateDelta` sets names (its ``changed`` and
``pointers`` labels; a label is one name or several joined by ``,``, pickled together), imports,
drops (``problems``) and deletes names. The namespace after applying every delta in order equals
the namespace after applying, in order, only the deltas that are the *last* to touch at least
one name: whatever an older delta did to a name, a later one overwrote. So a delta every one of
whose names a later delta touches is superseded, and so is every object-store key that only
superseded labels point to. The newest delta always stays (it carries the execution count).

Proposals (who ran which cell) matter for a while: a replica refuses a cell that another already
ran, and waits for the delta a LEAD owes. Only the `keep_recent` newest entries keep theirs.
Entries this code cannot decode are kept as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kernelfleet.raft.entries import KNOWN_KINDS, DeltaOrder, Proposal, Role, StateDelta, Wire

Indexed = tuple[int, Wire]
GROUP_SEPARATOR = ","  # as `kernels.replica.statesync_delta` joins the names of one frame


def _is_delta(wire: Any) -> bool:
    return (
        isinstance(wire, tuple | list)
        and len(wire) == 3
        and wire[0] == StateDelta.KIND
        and isinstance(wire[2], dict)
    )


def _is_known(wire: Any) -> bool:
    return isinstance(wire, tuple | list) and len(wire) == 3 and wire[0] in KNOWN_KINDS


def _labels(fields: dict[str, Any]) -> Iterable[tuple[str, str | None]]:
    """(label, store key or None) of every frame of a delta's fields."""
    for label in fields.get("changed") or {}:
        yield label, None
    for label, key in (fields.get("pointers") or {}).items():
        yield label, key


def _touched(fields: dict[str, Any]) -> set[str]:
    """Every name a delta sets, imports, drops or deletes."""
    names = {name for label, _ in _labels(fields) for name in label.split(GROUP_SEPARATOR)}
    names.update(fields.get("imports") or {})
    names.update(fields.get("problems") or {})
    names.update(fields.get("deleted") or ())
    return names


def _copies(entries: Sequence[Indexed]) -> set[int]:
    """Positions of the StateDeltas that never take effect (`DeltaOrder`: second copies of a
    retried append, deltas given up on)."""
    order = DeltaOrder(remembered=len(entries))
    found = set()
    for position, (index, wire) in enumerate(entries):
        if not _is_known(wire) or not isinstance(wire[2], dict):
            continue
        fields = wire[2]
        cell = str(fields.get("cell_id"))
        if _is_delta(wire):
            count = fields.get("execution_count")
            replica = str(fields.get("replica_id"))
            if not order.admit(cell, replica, count if isinstance(count, int) else 0):
                found.add(position)
        elif wire[0] == Proposal.KIND and fields.get("role") == Role.LEAD.value:
            attempt = fields.get("attempt")
            attempt = attempt if isinstance(attempt, int) else 0
            order.lead(index, cell, attempt, str(fields.get("replica_id")))
        elif wire[0] == Proposal.KIND and fields.get("role") == Role.SETTLE.value:
            order.settle(cell)
    return found


def _last_touchers(entries: Sequence[Indexed], copies: set[int]) -> set[int]:
    """Positions of the StateDeltas that are the last to touch at least one name (`copies`,
    which never take effect, left out)."""
    seen: set[str] = set()
    found = set()
    for position in range(len(entries) - 1, -1, -1):
        wire = entries[position][1]
        if _is_delta(wire) and position not in copies:
            names = _touched(wire[2])
            if not names <= seen:
                found.add(position)
            seen |= names
    return found


def prune(entries: Sequence[Indexed], keep_recent: int) -> list[Indexed]:
    """The entries a replica still needs, in order (see the module docstring).

    Keeps: every StateDelta that is the last to touch some name, and the newest one that
    takes effect; every entry among the `keep_recent` newest, but a superseded delta there only
    as its stub (`_stub`: which cell completed, by whom, at which count; not its values, which
    would make every catch-up carry thousands of them); every entry of a kind this code cannot
    read. Drops older superseded deltas, second copies of a delta (`DeltaOrder`: a replica that
    replays the pruned list must skip what the others skipped) and older proposals."""
    if not entries:
        return []
    copies = _copies(entries)
    needed = _last_touchers(entries, copies)
    deltas = [p for p, (_, wire) in enumerate(entries) if _is_delta(wire) and p not in copies]
    if deltas:
        needed.add(deltas[-1])
    recent_from = entries[-1][0] - keep_recent + 1
    kept: list[Indexed] = []
    for position, (index, wire) in enumerate(entries):
        if position in needed or not _is_known(wire):
            kept.append((index, wire))
        elif index >= recent_from and position not in copies:
            kept.append((index, _stub(wire) if _is_delta(wire) else wire))
    return kept


def _stub(wire: Wire) -> Wire:
    """A superseded delta without its values: applying it changes no name (every one it set
    was set again later), and `DeltaOrder` still learns that its cell completed."""
    fields = wire[2]
    return (
        wire[0],
        wire[1],
        {
            "cell_id": fields.get("cell_id"),
            "replica_id": fields.get("replica_id"),
            "changed": {},
            "pointers": {},
            "deleted": [],
            "execution_count": fields.get("execution_count", 0),
            "imports": {},
            "problems": {},
            "digests": {},
        },
    )


def live_keys(entries: Sequence[Indexed]) -> set[str]:
    """The object-store keys the namespace the entries build still points to: those of the
    labels holding at least one name that no later delta touches (second copies of a delta,
    which never take effect, left out)."""
    keys: set[str] = set()
    seen: set[str] = set()
    copies = _copies(entries)
    for position in range(len(entries) - 1, -1, -1):
        wire = entries[position][1]
        if not _is_delta(wire) or position in copies:
            continue
        fields = wire[2]
        for label, key in _labels(fields):
            if key is not None and not seen.issuperset(label.split(GROUP_SEPARATOR)):
                keys.add(key)
        seen |= _touched(fields)
    return keys


def referenced_keys(entries: Sequence[Indexed]) -> set[str]:
    """Every object-store key any of the entries points to (superseded or not)."""
    return {
        key
        for _, wire in entries
        if _is_delta(wire)
        for label, key in _labels(wire[2])
        if key is not None
    }
