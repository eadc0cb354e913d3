"""Change detection for state sync: a value's fingerprint, at less than the cost of its pickle.

A value's *fingerprint* is the sha256 of its pickle as `NamespacePickler` writes it (the pickle
a follower would load), with the bulk replaced by digests of exactly what the pickle would carry:

- a plain numpy array (``type(a) is numpy.ndarray``) whose dtype holds no Python objects stands
  for (dtype, shape, memory order, sha256 of its bytes in that order): what numpy pickles;
- a plain numpy array of dtype ``object`` whose elements are all immutable builtins (``str``,
  ``int``, ``float``, ``None``...: a pandas string column) stands for the sha256 of its pickle
  by the standard C pickler. Such elements hold nothing that another name could share or mutate,
  so they need neither cloudpickle nor a walk of the pickle's memo;
- any other out-of-band buffer (a torch tensor's bytes) stands for its sha256.

Everything else (containers, instances of notebook classes, pandas' managers, blocks and
indexes, functions) is pickled as for the real frame, and an array reached twice in one diff
(``df`` and ``df2 = df``, two frames sharing a block) is hashed once (`FingerprintCache`).

So two values whose pickles differ have different fingerprints, unless sha256 collides: a
mutation cannot hide from it, whatever object it went through. The fingerprint is never
unpickled; only its digest is kept. The same walk records the mutable objects the value's pickle
goes through (`shared`), for `statesync._Sharing`.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import io
import pickle
import sys
import types
from typing import Any

from kernelfleet.kernels.replica.statesync_pickling import (
    PROTOCOL,
    Namespace,
    NamespacePickler,
    NamespaceRef,
)

__all__ = ["FingerprintCache", "fingerprint"]

_SCALAR_TYPES = frozenset(
    {str, int, float, complex, bool, bytes, type(None), type(Ellipsis), range}
)
"""Element types that make an object array hashable by its plain pickle: immutable, and never
pickled by reference to a notebook definition."""


class FingerprintCache:
    """What one diff learnt once for all its values: each array's stand-in reduction by object
    id (the arrays are kept alive, so ids stay unique), the library classes met, and which
    dtype types link nothing. Valid only while no cell runs: build one per diff (or apply)."""

    def __init__(self) -> None:
        self._reduced: dict[int, tuple[Any, tuple[Any, ...] | None]] = {}
        self._classes_seen: set[type] = set()
        self.library_state: set[int] = set()
        """Ids of the attribute values of the library classes met in this diff."""
        pandas_api = getattr(sys.modules.get("pandas"), "api", None)
        extensions = getattr(pandas_api, "extensions", None)
        self.value_types: tuple[type, ...] = (
            (*NOT_SHARABLE, extensions.ExtensionDtype) if extensions else NOT_SHARABLE
        )

    def __len__(self) -> int:
        """How many arrays were reduced (each once, however many names reach it)."""
        return len(self._reduced)

    def reduced(self, array: Any) -> tuple[Any, ...] | None:
        """The stand-in reduction of a plain numpy array, or None to pickle it as usual."""
        known = self._reduced.get(id(array))
        if known is None:
            known = (array, _reduce_array(array))
            self._reduced[id(array)] = known
        return known[1]

    def note_class(self, cls: type) -> None:
        """Count the attribute values of `cls` and its bases as `library_state`, unless it is
        a notebook class (its attributes travel with it; a name may be bound to one)."""
        if cls not in self._classes_seen:
            self._classes_seen.add(cls)
            if cls.__module__ != "__main__":
                self.library_state.update(
                    id(value) for base in cls.__mro__ for value in vars(base).values()
                )


def fingerprint(
    value: Any, namespace: Namespace, cache: FingerprintCache, shared: dict[int, Any]
) -> str:
    """The fingerprint (sha256 hex) of `value`, a member of `namespace`; raises what pickling
    the value raises. Adds to `shared`, by id, the mutable objects its pickle goes through
    (containers, arrays, instances): two names that reach one of them must travel together."""
    stream = io.BytesIO()
    buffer_digests: list[bytes] = []
    pickler = _FingerprintPickler(stream, namespace, cache, buffer_digests)
    pickler.dump(value)
    _collect_shared(pickler, cache, shared)
    hasher = hashlib.sha256(stream.getbuffer())
    for digest in buffer_digests:
        hasher.update(digest)
    return hasher.hexdigest()


class _FingerprintPickler(NamespacePickler):
    def __init__(
        self,
        file: io.BytesIO,
        namespace: Namespace,
        cache: FingerprintCache,
        buffer_digests: list[bytes],
    ) -> None:
        # Not a bound method: pickler -> callback -> pickler would be a cycle, which only the
        # garbage collector frees, keeping each pickler's memo and stream alive until it runs.
        hash_into = functools.partial(_hash_buffer, buffer_digests)
        super().__init__(file, namespace, buffer_callback=hash_into)
        self._cache = cache
        numpy = sys.modules.get("numpy")
        self._ndarray: type | None = getattr(numpy, "ndarray", None)

    def reducer_override(self, obj: Any) -> Any:
        if self._ndarray is not None and type(obj) is self._ndarray:
            reduced = self._cache.reduced(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def _hash_buffer(digests: list[bytes], buffer: pickle.PickleBuffer) -> bool:
    try:
        raw = buffer.raw()
    except BufferError:  # not contiguous
        raw = memoryview(memoryview(buffer).tobytes())
    digests.append(hashlib.sha256(raw).digest())
    return False  # out of band: the pickle gets a marker, the digest stands for the bytes


def _reduce_array(array: Any) -> tuple[Any, ...] | None:
    """(marker, (what the array's pickle carries, its bulk as a digest)), or None."""
    dtype = array.dtype
    if dtype.hasobject:
        if dtype.kind != "O" or not set(map(type, array.ravel(order="K"))) <= _SCALAR_TYPES:
            return None  # may hold mutable or notebook-defined objects: pickle it as usual
        digest = hashlib.sha256(pickle.dumps(array, protocol=PROTOCOL)).hexdigest()
        return (_object_array, (digest,))
    # numpy pickles an array in Fortran order if it is Fortran- but not C-contiguous, else in
    # C order (a copy if it is neither); the digest covers the bytes in that order.
    flags = array.flags
    order = "F" if flags.f_contiguous and not flags.c_contiguous else "C"
    ordered = array.T if order == "F" else array
    if not ordered.flags.c_contiguous:
        ordered = ordered.copy(order="C")
    hasher = hashlib.sha256()
    if ordered.size:
        hasher.update(ordered.reshape(-1).view("u1"))
    return (_plain_array, (dtype, array.shape, order, hasher.hexdigest()))


def _plain_array(*_: Any) -> Any:
    """The marker of a fingerprinted plain array; fingerprints are never unpickled."""
    raise pickle.UnpicklingError("a state-sync fingerprint is not a pickle of a value")


def _object_array(*_: Any) -> Any:
    """The marker of a fingerprinted object array of immutable scalars (never unpickled)."""
    raise pickle.UnpicklingError("a state-sync fingerprint is not a pickle of a value")


def _collect_shared(
    pickler: pickle.Pickler, cache: FingerprintCache, shared: dict[int, Any]
) -> None:
    """Add to `shared` the objects of `pickler`'s memo whose aliasing between names matters:
    containers, arrays, instances. Left out: immutable scalars; singletons pickled by
    reference (classes, functions, enum members); dtypes (value objects that libraries cache
    and hand to every array or frame of that type); the dicts of a function's definition
    (each instance of a notebook class reaches its methods'); and the attribute values of a
    library's class (pandas pickles one list, ``NDFrame._metadata``, with every frame). A
    notebook class's own attributes stay in: the class travels by value, and a name may be
    bound to one of them."""
    objects = [obj for _index, obj in pickler.memo.copy().values()]
    excluded: set[int] = set()
    candidates = []
    for obj in objects:
        kind = type(obj)
        if kind in _SCALAR_TYPES:
            continue
        if kind is types.FunctionType:
            excluded.update(map(id, (obj.__dict__, obj.__annotations__, obj.__kwdefaults__)))
        elif isinstance(obj, type):
            cache.note_class(obj)
        elif isinstance(obj, list | dict | set | bytearray) or _is_instance_state(obj, cache):
            candidates.append(obj)
    for obj in candidates:
        if id(obj) not in excluded and id(obj) not in cache.library_state:
            shared[id(obj)] = obj


NOT_SHARABLE: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    staticmethod,
    classmethod,
    property,
    enum.Enum,
    NamespaceRef,
)


def _is_instance_state(obj: Any, cache: FingerprintCache) -> bool:
    kind = type(obj)
    if kind.__name__ == "ndarray" and kind.__module__ == "numpy":
        return True
    if isinstance(obj, cache.value_types) or kind.__name__ == "cython_function_or_method":
        return False
    return hasattr(obj, "__dict__")
