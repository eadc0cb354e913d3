"""State sync between a kernel's replicas: what changed in the user namespace, and applying it.

After each cell the executor replica runs::

    delta = tracker.diff()                  # what changed since the last sync (pickles it)
    encoded = encode(delta, store)          # small values inline, large ones into the store
    <append encoded.to_dict() to the Raft log>
    tracker.commit(delta, encoded)          # only once the entry is committed

and every follower, for each committed entry in log order::

    apply(EncodedDelta.from_dict(entry), shell.user_ns, store, tracker=tracker)

Nothing here knows Raft or Jupyter: the namespace is any dict (IPython's ``user_ns``).

Threads: a tracker is used by one thread at a time. `NamespaceTracker.diff` and `encode` read
the live values (frames hold views of array memory, not copies), so both must finish before the
next cell on this replica may mutate the namespace: run them after ``execute_reply`` is sent and
before the next ``execute_request`` is handled. `apply` writes the namespace and must not
overlap a cell either (a replica may not execute cell N+1 before it applied cell N).

What syncs, and how:

- Ignored: IPython's own names (``In``, ``Out``, ``_``, ``__``, ``___``, ``_i*``, ``_<n>``,
  ``_ih``, ``_oh``, ``_dh``, ``exit``, ``quit``, ``get_ipython``), dunder names, and what was in
  the namespace at kernel start (``hidden``: IPython's ``user_ns_hidden``) while still bound to
  the same object.
- Modules sync as imports by name (``np -> "numpy"``); the follower imports them.
- Every other value syncs as a cloudpickle frame (see
  `kernelfleet.kernels.replica.statesync_pickling`):
  notebook functions and classes by value, bound to the follower's namespace; arrays and
  tensors with their memory out of band. Open files, locks, generators... are "problems".
- Names whose values share a mutable object (``opt`` holds ``net``'s parameters; ``b = a``)
  travel as one pickle whenever any of them changes, so the sharing survives on followers.
- Deleted names sync as deletions.
- A value that cannot be pickled is reported once (name and reason) until it is rebound (it is
  retried every cell, so one that becomes picklable in place syncs then); the
  followers drop their stale copy so a cell there fails with NameError instead of using it.
  The user is told once per name for the tracker's life (`NamespaceTracker.notices`, see
  `kernelfleet.kernels.replica.statesync_notice`).

Change detection: a value that is *deeply immutable* (int, str, bytes, tuples of those, ...)
and still the very object last synced is skipped: identity is proof, and the tracker holds a
reference so the id cannot be reused. Every other value's fingerprint
(`kernelfleet.kernels.replica.statesync_fingerprint`) is compared with the one last synced, because
in-place mutation (``a += 1``, ``df.loc[...] = ...``, ``model.train_step()``) keeps identity.
A fingerprint is the value's pickle with each plain numpy array's bytes replaced by their sha256
(a string column's elements by the digest of their plain pickle): it changes whenever the pickle
would, at the cost of hashing array memory in place. Only changed values are pickled for real
(the argument: docs/replication.md, "How a cell's changes are found").
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import re
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kernelfleet.kernels.objectstore import ObjectStore, ObjectStoreError
from kernelfleet.kernels.replica.statesync_delta import (
    FORMAT_VERSION,
    GROUP_SEPARATOR,
    ApplyFailed,
    ApplyReport,
    EncodedDelta,
    StateSyncError,
    label_names,
)
from kernelfleet.kernels.replica.statesync_fingerprint import FingerprintCache, fingerprint
from kernelfleet.kernels.replica.statesync_notice import NoticeBoard, likely_unsyncable
from kernelfleet.kernels.replica.statesync_pickling import (
    Frame,
    Namespace,
    load_from_store,
    loads_frame,
    serialize,
)

__all__ = [
    "FORMAT_VERSION",
    "INLINE_BUDGET",
    "INLINE_LIMIT",
    "ApplyFailed",
    "ApplyReport",
    "Delta",
    "EncodedDelta",
    "NamespaceTracker",
    "StateSyncError",
    "apply",
    "encode",
    "namespace_digest",
]

log = logging.getLogger("kernelfleet.statesync")

INLINE_LIMIT = 64 * 1024
"""Largest value carried inside a Raft entry; anything bigger goes to the object store."""
INLINE_BUDGET = 192 * 1024
"""Most inline bytes in one delta, so an entry stays well under the ~256 KiB the log accepts."""
REASON_CHARS = 300

IPYTHON_NAMES = frozenset(
    {"In", "Out", "_", "__", "___", "_ih", "_oh", "_dh", "_exit_code", "exit", "quit"}
    | {"get_ipython"}
)
_IPYTHON_PATTERN = re.compile(r"_i+\d*|_\d+|__\w*__")
_IMMUTABLE_TYPES = frozenset(
    {int, float, complex, bool, str, bytes, type(None), type(Ellipsis), range}
)  # not slice: slice([1], 2) holds a list
_NOT_PINNED = object()


@dataclass
class _Synced:
    """What the replicas hold for a name after the last sync."""

    kind: Literal["value", "import", "problem"]
    ident: int
    digest: str | None = None
    module: str | None = None
    reason: str | None = None
    pinned: Any = _NOT_PINNED


@dataclass
class Delta:
    """What changed in a namespace since the last committed sync (executor side, not plain data).

    `changed`: label -> frame to send (a label is a name, or names that share objects joined
    by ``,``; see `kernelfleet.kernels.replica.statesync_delta`). Frames view live memory:
    encode the delta before the namespace changes again. `problems` are names newly found
    unpicklable (each reported once); `definitions` lists the sent names that are notebook
    functions or classes (for logs).
    """

    changed: dict[str, Frame] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    definitions: list[str] = field(default_factory=list)
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    _pending: dict[str, _Synced] = field(default_factory=dict, repr=False)

    def __bool__(self) -> bool:
        return bool(self.changed or self.imports or self.deleted or self.problems)

    def names(self) -> set[str]:
        """Every name whose value this delta sends (groups expanded)."""
        return set(self._fingerprints)


class NamespaceTracker:
    """Which names of one user namespace sync, and what changed since the last committed sync.

    One per replica, built at kernel start before any cell runs. `hidden` is what to ignore
    from the start: a mapping name -> value (IPython's ``user_ns_hidden``; a name is ignored
    while still bound to that value) or an iterable of names (always ignored); by default, a
    snapshot of the namespace now. One thread at a time (see the module docstring).
    """

    def __init__(
        self, namespace: Namespace, *, hidden: Mapping[str, Any] | Iterable[str] | None = None
    ) -> None:
        self.namespace = namespace
        self._hidden_values: Mapping[str, Any] = {}
        self._hidden_names: frozenset[str] = frozenset()
        if hidden is None:
            self._hidden_values = dict(namespace)
        elif isinstance(hidden, Mapping):
            self._hidden_values = hidden
        else:
            self._hidden_names = frozenset(hidden)
        self._synced: dict[str, _Synced] = {}
        self._board = NoticeBoard()

    def is_tracked(self, name: str, value: Any) -> bool:
        """Whether `name` bound to `value` is part of the synced state."""
        if name in IPYTHON_NAMES or name in self._hidden_names or _IPYTHON_PATTERN.fullmatch(name):
            return False
        hidden = self._hidden_values.get(name, _NOT_PINNED)
        return hidden is _NOT_PINNED or hidden is not value

    def tracked_items(self, namespace: Namespace | None = None) -> list[tuple[str, Any]]:
        """The synced (name, value) pairs of `namespace` (default: this tracker's), in order."""
        items = list((self.namespace if namespace is None else namespace).items())
        return [(name, value) for name, value in items if self.is_tracked(name, value)]

    @property
    def problems(self) -> dict[str, str]:
        """Names currently not synced because their value cannot be pickled, and why."""
        return {n: s.reason or "" for n, s in self._synced.items() if s.kind == "problem"}

    def early_notices(self) -> list[str]:
        """Notices for the names bound to a value of a kind that never syncs (an open file, a
        widget...; one that indeed fails to pickle), not told before. Cheap: call it at the end
        of every cell, before its reply, so the notice is in that cell's output."""
        found = []
        for name, value in self.tracked_items():
            if name in self._board or not likely_unsyncable(value):
                continue
            try:
                serialize(value, self.namespace)
            except Exception:
                found.append((name, value))
        return self._board.tell(found)

    def notices(self, names: Iterable[str]) -> list[str]:
        """Notices for `names` (an encoded delta's ``problems``) not told before."""
        return self._board.tell((n, self.namespace[n]) for n in names if n in self.namespace)

    def diff(self) -> Delta:
        """What changed since the last `commit` (or `apply`). Pickles only what changed (and
        the names that share objects with it); does not store or send.

        Each value's `fingerprint` is compared with the one last synced; a value reachable
        from several names is fingerprinted once. Calling it again without a commit
        recomputes against the same baseline, so a delta that failed to publish is simply
        included in the next one.
        """
        delta = Delta()
        fingerprints: dict[str, str] = {}
        changed: list[str] = []
        sharing = _Sharing()
        cache = FingerprintCache()
        seen: dict[int, tuple[str, dict[int, Any]]] = {}  # one object under several names
        for name, value in self.tracked_items():
            prev = self._synced.get(name)
            module = _import_name(value)
            if module is not None:
                if prev is None or prev.kind != "import" or prev.module != module:
                    delta.imports[name] = module
                    delta._pending[name] = _Synced("import", id(value), module=module)
                continue
            if prev is not None and prev.pinned is value:
                continue  # deeply immutable and the same object: unchanged
            known = seen.get(id(value))
            if known is None:
                shared: dict[int, Any] = {}
                try:
                    known = seen[id(value)] = (
                        fingerprint(value, self.namespace, cache, shared),
                        shared,
                    )
                except Exception as exc:
                    self._problem(delta, name, value, prev, exc)
                    continue
            fingerprints[name], shared = known
            sharing.add(name, shared)
            if _changed(prev, fingerprints[name]):
                changed.append(name)
        tracked = {name for name, _ in self.tracked_items()}
        delta.deleted = [name for name in self._synced if name not in tracked]
        for names in sharing.groups_of(changed, order=list(fingerprints)):
            self._send(delta, names, fingerprints)
        return delta

    def _problem(
        self, delta: Delta, name: str, value: Any, prev: _Synced | None, exc: Exception
    ) -> None:
        if prev is not None and prev.kind == "problem" and prev.ident == id(value):
            return  # still unpicklable, already reported
        reason = _describe(exc)
        log.warning("%s is not synced to the other replicas: %s", name, reason)
        delta.problems[name] = reason
        delta._pending[name] = _Synced("problem", id(value), reason=reason)

    def _send(self, delta: Delta, names: list[str], fingerprints: dict[str, str]) -> None:
        """Pickle the changed names `names` (one label: they share objects) into `delta`."""
        together = {name: self.namespace[name] for name in names}
        try:
            if len(names) == 1:
                delta.changed[names[0]] = serialize(together[names[0]], self.namespace)
            else:
                delta.changed[GROUP_SEPARATOR.join(names)] = serialize(together, self.namespace)
        except Exception as exc:  # the fingerprint pickled, the value did not (an array?)
            for name in names:
                self._problem(delta, name, together[name], self._synced.get(name), exc)
            return
        for name, value in together.items():
            delta._fingerprints[name] = fingerprints[name]
            pinned = value if _deeply_immutable(value) else _NOT_PINNED
            delta._pending[name] = _Synced("value", id(value), pinned=pinned)
            if _is_notebook_definition(value):
                delta.definitions.append(name)

    def commit(self, delta: Delta, encoded: EncodedDelta) -> None:
        """Make `delta` (as `encoded`) the new baseline: call once its log entry is committed."""
        for name in delta.deleted:
            self._synced.pop(name, None)
        for name, pending in delta._pending.items():
            if pending.kind == "value" and name in encoded.problems:  # failed while storing
                pending = _Synced("problem", pending.ident, reason=encoded.problems[name])
            elif pending.kind == "value":
                pending.digest = delta._fingerprints[name]
            self._synced[name] = pending

    def note_applied(self, encoded: EncodedDelta, report: ApplyReport) -> None:
        """Follower side: the applied values are the new baseline (called by `apply`)."""
        for name in (*report.deleted, *report.dropped, *report.failed):
            self._synced.pop(name, None)
        self._board.told(report.dropped)  # the replica that found them told the user
        for name in report.imported:
            module = encoded.imports[name]
            self._synced[name] = _Synced("import", id(self.namespace[name]), module=module)
        cache = FingerprintCache()
        for name in report.applied:
            value = self.namespace[name]
            digest = encoded.digests.get(name)  # the executor's fingerprint
            if digest is None:  # left out of a large delta, or an older replica's entry
                digest = self._own_fingerprint(value, cache)
            pinned = value if _deeply_immutable(value) else _NOT_PINNED
            self._synced[name] = _Synced("value", id(value), digest=digest, pinned=pinned)

    def _own_fingerprint(self, value: Any, cache: FingerprintCache) -> str | None:
        try:
            return fingerprint(value, self.namespace, cache, {})
        except Exception:  # pickled on the executor, not here: count it as changed
            return None


class _Sharing:
    """Union-find of names whose pickles went through one same mutable object."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}
        self._owner: dict[int, str] = {}
        self._alive: list[dict[int, Any]] = []  # keeps ids unique while the diff runs

    def _find(self, name: str) -> str:
        root = self._parent.setdefault(name, name)
        while root != self._parent[root]:
            root = self._parent[root]
        self._parent[name] = root
        return root

    def add(self, name: str, shared: dict[int, Any]) -> None:
        self._alive.append(shared)
        self._find(name)
        for object_id in shared:
            other = self._owner.setdefault(object_id, name)
            if other != name:
                self._parent[self._find(other)] = self._find(name)

    def groups_of(self, changed: list[str], order: list[str]) -> list[list[str]]:
        """The groups to send: every name linked to a changed one, in namespace order."""
        roots = {self._find(name) for name in changed}
        groups: dict[str, list[str]] = {}
        for name in order:
            if self._find(name) in roots:
                groups.setdefault(self._find(name), []).append(name)
        return list(groups.values())


def _changed(prev: _Synced | None, fingerprint: str) -> bool:
    if prev is None or prev.kind != "value" or prev.digest is None:
        return True
    return fingerprint != prev.digest


def encode(
    delta: Delta,
    store: ObjectStore,
    *,
    inline_limit: int = INLINE_LIMIT,
    inline_budget: int = INLINE_BUDGET,
) -> EncodedDelta:
    """Turn a `Delta` into plain data, writing large values to `store` (executor, worker thread).

    A frame goes inline if it is at most `inline_limit` bytes and the delta's inline total
    stays within `inline_budget` (smallest first); otherwise it is streamed into the store
    chunk by chunk (no joined copy) and only its key is kept. A frame the store refuses
    becomes a problem for its names; the rest still syncs.

    Each sent name's fingerprint goes in ``digests`` too, and counts against `inline_budget`.
    Those of names sent alone are left out when they would take more than half of it (a cell
    that binds over ~1,000 names): a follower then fingerprints what it applied itself.
    """
    started = time.monotonic()
    encoded = EncodedDelta(
        imports=dict(delta.imports), deleted=list(delta.deleted), problems=dict(delta.problems)
    )
    encoded.digests = _digests_to_send(delta, inline_budget)
    budget = inline_budget - sum(len(name) + DIGEST_BYTES for name in encoded.digests)
    inline: set[str] = set()
    total = 0
    for label, frame in sorted(delta.changed.items(), key=lambda item: item[1].size):
        if frame.size <= inline_limit and total + frame.size <= budget:
            inline.add(label)
            total += frame.size
    stored = 0
    for label, frame in delta.changed.items():
        names = label_names(label)
        if label in inline:
            encoded.changed[label] = frame.to_bytes()
            continue
        try:
            encoded.pointers[label] = _store_frame(frame, store)
            stored += frame.size
        except (OSError, ObjectStoreError) as exc:
            reason = _describe(exc, prefix=f"could not save it to {store}: ")
            log.error("%s not synced: %s", label, reason)
            encoded.problems.update(dict.fromkeys(names, reason))
    log.debug(
        "encoded %d inline (%d B), %d stored (%d B), %d imports, %d deleted in %.3f s",
        len(encoded.changed),
        total,
        len(encoded.pointers),
        stored,
        len(encoded.imports),
        len(encoded.deleted),
        time.monotonic() - started,
    )
    return encoded


DIGEST_BYTES = 64 + 16
"""What one name's fingerprint adds to a log entry, besides the name: 64 hex digits, framing."""


def _digests_to_send(delta: Delta, inline_budget: int) -> dict[str, str]:
    """The fingerprints a delta carries: every sent name's, or only those of names sent in a
    group (required: a group's frame has no digest of each name) if all would take more than
    half of `inline_budget`."""
    digests = dict(delta._fingerprints)
    if sum(len(name) + DIGEST_BYTES for name in digests) > inline_budget // 2:
        grouped = [label for label in delta.changed if GROUP_SEPARATOR in label]
        digests = {n: digests[n] for label in grouped for n in label_names(label)}
    return digests


def _store_frame(frame: Frame, store: ObjectStore) -> str:
    known = frame._digest
    if known is not None and store.keep(known):  # refreshed: not collected meanwhile
        return known
    key = store.put_chunks(frame.chunks())
    if known is not None and key != known:
        log.warning("a value changed while it was being saved (%s != %s)", key, known)
    frame.set_digest(key)
    return key


def apply(
    encoded: EncodedDelta,
    namespace: Namespace,
    store: ObjectStore,
    *,
    tracker: NamespaceTracker | None = None,
    verify: bool = True,
) -> ApplyReport:
    """Apply one delta to a follower's namespace (follower, worker thread, in log order).

    Imports, then values (inline and fetched from `store`, hashed against their key when
    `verify`), then drops (`problems`) and deletions. A name that cannot be applied is removed
    from the namespace (no stale value survives) and the rest is still applied; then
    `ApplyFailed` is raised, naming each such variable and why, with the full `report`.
    With `tracker`, the applied state becomes that tracker's baseline, so this replica does
    not send it back when it executes next.
    """
    started = time.monotonic()
    report = ApplyReport()
    for name, module in encoded.imports.items():
        try:
            namespace[name] = importlib.import_module(module)
            report.imported.append(name)
        except Exception as exc:
            _fail(report, namespace, [name], _describe(exc, prefix=f"cannot import {module}: "))
    for label, data in encoded.changed.items():
        _apply_frame(report, namespace, label, functools.partial(_load_inline, data, namespace))
    for label, key in encoded.pointers.items():
        load = functools.partial(load_from_store, store, key, namespace, verify=verify)
        _apply_frame(report, namespace, label, load, key=key)
    for name in encoded.problems:
        namespace.pop(name, None)
        report.dropped.append(name)
    for name in encoded.deleted:
        namespace.pop(name, None)
        report.deleted.append(name)
    report.seconds = time.monotonic() - started
    if tracker is not None:
        tracker.note_applied(encoded, report)
    if report.failed:
        raise ApplyFailed(report)
    return report


def _load_inline(data: bytes, namespace: Namespace) -> tuple[Any, int]:
    return loads_frame(data, namespace), 0


def _apply_frame(
    report: ApplyReport,
    namespace: Namespace,
    label: str,
    load: Callable[[], tuple[Any, int]],
    key: str | None = None,
) -> None:
    names = label_names(label)
    try:
        value, size = load()
    except ObjectStoreError as exc:
        _fail(report, namespace, names, str(exc))
        return
    except Exception as exc:
        where = f"cannot load object {key}: " if key else "cannot unpickle it: "
        _fail(report, namespace, names, _describe(exc, prefix=where))
        return
    report.bytes_fetched += size
    if len(names) == 1:
        namespace[names[0]] = value
    elif isinstance(value, dict) and sorted(value) == sorted(names):
        namespace.update(value)
    else:
        _fail(report, namespace, names, f"frame {label!r} does not hold exactly these names")
        return
    report.applied.extend(names)


def _fail(report: ApplyReport, namespace: Namespace, names: list[str], reason: str) -> None:
    for name in names:
        namespace.pop(name, None)
        report.failed[name] = reason
        log.error("could not apply %s: %s", name, reason)


def namespace_digest(namespace: Namespace, tracker: NamespaceTracker) -> str:
    """A sha256 hex of the synced part of `namespace`, equal on replicas holding equal state.

    Names are taken in sorted order; modules count by name; values by a canonical pickle
    (sets sorted, so string hash randomisation across processes does not matter). Values
    that cannot be pickled are left out (they do not sync). Aliasing between names is not
    part of it. For tests and consistency checks: it re-pickles everything.
    """
    hasher = hashlib.sha256()
    for name, value in sorted(tracker.tracked_items(namespace), key=lambda item: item[0]):
        module = _import_name(value)
        if module is not None:
            part = f"import:{module}"
        else:
            try:
                part = serialize(value, namespace, canonical=True).digest
            except Exception:
                continue
        hasher.update(f"{name}\0{part}\n".encode())
    return hasher.hexdigest()


def _import_name(value: Any) -> str | None:
    """The module name to import for `value`, if it is a module importable by that name."""
    if isinstance(value, types.ModuleType):
        name = getattr(value, "__name__", None)
        if isinstance(name, str) and name != "__main__" and sys.modules.get(name) is value:
            return name
    return None


def _deeply_immutable(value: Any, budget: int = 256) -> bool:
    """True if `value` and everything it holds are immutable builtins (bounded walk)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _IMMUTABLE_TYPES:
            continue
        if kind is tuple or kind is frozenset:
            budget -= len(item)
            if budget < 0:
                return False
            stack.extend(item)
            continue
        return False
    return True


def _is_notebook_definition(value: Any) -> bool:
    return isinstance(value, types.FunctionType | type) and value.__module__ == "__main__"


def _describe(exc: BaseException, prefix: str = "") -> str:
    text = f"{prefix}{type(exc).__name__}: {exc}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"
