"""The plain data of state sync: `EncodedDelta` (a log entry), `ApplyReport`, and errors.

A frame in an entry is keyed by a *label*: one name, or several names joined by ``,``
(identifiers never contain a comma). A group label carries one pickle of a dict of those
names, used when the names share objects (``opt`` holds ``net``'s parameters): pickled
together, the sharing survives on the followers; pickled apart, each would get its own copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.errors import FleetError, InvalidRequest

FORMAT_VERSION = 1
GROUP_SEPARATOR = ","


class StateSyncError(FleetError):
    """Base class of state-sync failures."""

    reason = "state-sync-error"


class ApplyFailed(StateSyncError):
    """Some names of a delta could not be applied; the rest were. `report` says which."""

    reason = "state-sync-apply-failed"

    def __init__(self, report: ApplyReport) -> None:
        self.report = report
        details = "; ".join(f"{name}: {why}" for name, why in report.failed.items())
        super().__init__(f"could not apply {len(report.failed)} name(s) of a delta: {details}")


def label_names(label: str) -> list[str]:
    """The names a frame label stands for (one, or a group)."""
    return label.split(GROUP_SEPARATOR)


@dataclass
class EncodedDelta:
    """One cell's state change as plain data: what goes into the Raft log.

    `changed`: label -> frame bytes (small values); `pointers`: label -> object-store key;
    `imports`: name -> module name; `deleted`: names to remove; `problems`: name -> why it does
    not sync (followers drop their stale copy); `digests`: name -> the executor's fingerprint of
    each sent name (`kernelfleet.kernels.replica.statesync_fingerprint`), so a follower knows
    exactly what it holds when it executes next. It may be left out for names sent alone (a
    very large delta, or an older replica's entry): the follower then fingerprints them itself.
    """

    changed: dict[str, bytes] = field(default_factory=dict)
    pointers: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def __bool__(self) -> bool:
        return bool(self.changed or self.pointers or self.imports or self.deleted or self.problems)

    def names(self) -> set[str]:
        """Every name whose value this delta carries (inline or stored; groups expanded)."""
        return {name for label in (*self.changed, *self.pointers) for name in label_names(label)}

    def labels(self) -> Iterator[tuple[str, bytes | str]]:
        """(label, inline bytes or store key) for every frame, inline ones first."""
        yield from self.changed.items()
        yield from self.pointers.items()

    def inline_bytes(self) -> int:
        """Bytes of inline values (the bulk of the log entry's size)."""
        return sum(len(data) for data in self.changed.values())

    def keys(self) -> set[str]:
        """The object-store keys this delta references (for the log owner's garbage collection)."""
        return set(self.pointers.values())

    def to_dict(self) -> dict[str, Any]:
        """Builtins only (dict, list, str, bytes, int): safe for any log's serializer."""
        return {
            "version": self.version,
            "changed": dict(self.changed),
            "pointers": dict(self.pointers),
            "imports": dict(self.imports),
            "deleted": list(self.deleted),
            "problems": dict(self.problems),
            "digests": dict(self.digests),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EncodedDelta:
        """Inverse of `to_dict`; `InvalidRequest` if malformed or of another format version."""
        if not isinstance(data, Mapping) or data.get("version") != FORMAT_VERSION:
            raise InvalidRequest(f"not a version {FORMAT_VERSION} state delta: {data!r:.200}")
        try:
            return cls(
                changed=_typed_dict(data.get("changed", {}), bytes),
                pointers=_typed_dict(data.get("pointers", {}), str),
                imports=_typed_dict(data.get("imports", {}), str),
                deleted=[_typed(name, str) for name in data.get("deleted", [])],
                problems=_typed_dict(data.get("problems", {}), str),
                digests=_typed_dict(data.get("digests", {}), str),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidRequest(f"malformed state delta: {exc}") from None


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _typed_dict(value: Any, kind: type) -> dict[str, Any]:
    return {_typed(k, str): _typed(v, kind) for k, v in dict(value).items()}


@dataclass
class ApplyReport:
    """What `apply` did. `failed`: name -> why (those names were removed from the namespace)."""

    applied: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    bytes_fetched: int = 0
    seconds: float = 0.0
