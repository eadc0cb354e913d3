"""How one namespace value becomes bytes and back: the frame format and the picklers.

Every synced value is pickled with cloudpickle, protocol 5, with out-of-band buffers: a numpy
array (or a torch tensor, see below) contributes its memory as a buffer *view* instead of being
copied into the pickle. A value's wire form is a frame::

    b"KFS1" | u32 buffer count n | u64 pickle length | n x u64 buffer length | pickle | buffers

A frame is either joined into ``bytes`` (small values, inline in the Raft log) or streamed
chunk by chunk into the object store, where its sha256 is its key. The same sha256 is the
value's fingerprint for change detection, so a value's fingerprint and its store key agree.

Notebook functions and classes (module ``__main__``) pickle by value (cloudpickle). A function
whose globals are the user namespace is pickled *without* a snapshot of the globals it reads:
on the follower it is rebuilt with the follower's namespace as its globals, so it sees later
changes to those names there (and ``global x`` in it writes the follower's namespace), exactly
as on the executor. Instances of a notebook class keep ``type(obj) is Class`` across separate
deltas and in both directions (cloudpickle's class tracker ids travel in the pickle; each
namespace maps them to its own classes, see `class_registry`).

This leans on cloudpickle 3.x internals (``_dynamic_function_reduce``, ``_function_setstate``,
``_code_reduce``, the skeleton-class makers); the tests pin the behaviour.

Torch (only when the user imported it): a dense CPU/GPU tensor or ``nn.Parameter`` pickles as
its raw bytes out of band (torch's own pickling copies the data twice in memory); it is rebuilt
on the CPU, contiguous, with ``requires_grad`` kept. Views sharing storage become copies.

A torchdata ``StatefulDataLoader`` pickles without its live iterator, with its position
(``state_dict()``), which the follower's copy loads: it yields the same next batch.

Open files do not pickle (cloudpickle would read the whole file into the pickle and hand the
follower a StringIO); neither do locks, sockets, generators: the caller reports those.

Callers: `kernelfleet.kernels.replica.statesync` only, on the thread that runs state sync, while no
cell mutates the namespace (a frame holds live views of the values' memory).
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import struct
import sys
import types
import weakref
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import cloudpickle
from cloudpickle import cloudpickle as _cp

from kernelfleet.kernels.objectstore import CHUNK_BYTES, HASH_NAME, ObjectCorrupt, ObjectStore

MAGIC = b"KFS1"
PROTOCOL = 5
_FIXED = struct.Struct("<4sIQ")
_MAX_BUFFERS = 1 << 20

Namespace = MutableMapping[str, Any]


@dataclass(eq=False)
class Frame:
    """One pickled value: the pickle stream plus out-of-band buffer views (not copies).

    `size` is the frame's length in bytes; `digest` (sha256 hex of the frame) is computed on
    first use and cached; `chunks()` yields the frame's pieces for streaming.
    """

    main: bytes
    buffers: tuple[memoryview, ...]
    _digest: str | None = field(default=None, repr=False)

    @property
    def header(self) -> bytes:
        lengths = [len(b) for b in self.buffers]
        return _FIXED.pack(MAGIC, len(lengths), len(self.main)) + struct.pack(
            f"<{len(lengths)}Q", *lengths
        )

    @property
    def size(self) -> int:
        return _FIXED.size + 8 * len(self.buffers) + len(self.main) + sum(map(len, self.buffers))

    def chunks(self) -> Iterator[bytes | memoryview]:
        yield self.header
        yield self.main
        yield from self.buffers

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks())

    @property
    def digest(self) -> str:
        if self._digest is None:
            hasher = hashlib.new(HASH_NAME)
            for chunk in self.chunks():
                hasher.update(chunk)
            self._digest = hasher.hexdigest()
        return self._digest

    def set_digest(self, digest: str) -> None:
        """Record a digest computed elsewhere (the store's key after streaming the frame)."""
        self._digest = digest


class NamespaceRef:
    """Stands for "the user namespace of whoever unpickles this" inside a pickle."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (user_namespace, ())


_NAMESPACE_REF = NamespaceRef()


def user_namespace() -> Namespace:
    """Placeholder resolved by `NamespaceUnpickler`; a plain unpickler cannot resolve it."""
    raise pickle.UnpicklingError(
        "this pickle holds notebook functions bound to a user namespace; "
        "load it with kernelfleet.kernels.replica.statesync_pickling.loads_frame"
    )


def _namespace_function_setstate(func: Any, state: Any) -> None:
    globals_ = func.__globals__
    missing = object()
    builtins_before = globals_.get("__builtins__", missing)
    _cp._function_setstate(func, state)
    if builtins_before is not missing:  # cloudpickle overwrites it; keep IPython's
        globals_["__builtins__"] = builtins_before


class NamespacePickler(cloudpickle.Pickler):
    """cloudpickle, with functions bound to `namespace` pickled without their globals."""

    def __init__(self, file: io.BytesIO, namespace: Namespace, **kwargs: Any) -> None:
        super().__init__(file, protocol=PROTOCOL, **kwargs)
        self._namespace = namespace
        torch = sys.modules.get("torch")
        self._tensor_types: tuple[type, ...] = ()
        if torch is not None and hasattr(torch, "Tensor"):
            self._tensor_types = (torch.Tensor, torch.nn.Parameter)
        stateful = sys.modules.get("torchdata.stateful_dataloader")
        self._stateful_loader: type | None = getattr(stateful, "StatefulDataLoader", None)

    def _dynamic_function_reduce(self, func: Any) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if func.__globals__ is not self._namespace:
            return reduced
        make_function, (code, _base, name, argdefs, closure), state, *_ = reduced
        func_state, slotstate = state
        slotstate = {**slotstate, "__globals__": {}}
        return (
            make_function,
            (code, _NAMESPACE_REF, name, argdefs, closure),
            (func_state, slotstate),
            None,
            None,
            _namespace_function_setstate,
        )

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is types.CodeType:
            # cloudpickle copies co_name but not co_qualname/co_filename; an unpickled code
            # object shares them (interning), so its pickle would differ from the original's.
            constructor, args = _cp._code_reduce(obj)
            return constructor, tuple("".join(a) if type(a) is str else a for a in args)
        if self._tensor_types and kind in self._tensor_types:
            return _reduce_tensor(obj)
        if self._stateful_loader is not None and isinstance(obj, self._stateful_loader):
            return _reduce_stateful_loader(obj)
        if isinstance(obj, io.IOBase) and not isinstance(obj, io.BytesIO | io.StringIO):
            # cloudpickle would read a whole file into the pickle (every cell) and hand the
            # follower a StringIO: an open file is host-local state and does not sync.
            name = getattr(obj, "name", "?")
            raise pickle.PicklingError(
                f"cannot pickle {kind.__qualname__} object (open file {name!r})"
            )
        reduced = super().reducer_override(obj)
        if isinstance(reduced, tuple) and len(reduced) == 6 and reduced[5] is _cp._class_setstate:
            class_registry(self._namespace)[reduced[1][-2]] = obj  # its tracker id, see below
            # copyreg caches __slotnames__ on a class the first time one of its instances is
            # pickled: not part of the class's definition, and it would make its pickle change.
            state, slotstate = reduced[2]
            if "__slotnames__" in state:
                state = {k: v for k, v in state.items() if k != "__slotnames__"}
                reduced = (*reduced[:2], (state, slotstate), *reduced[3:])
        return reduced


class CanonicalPickler(NamespacePickler):
    """For digests only (never unpickled): sets go in a process-independent order.

    The C pickler offers no hook for sets but ``persistent_id``, which sees every object:
    a set is replaced by its elements sorted by their own canonical pickles (string hashing
    is randomised per process, so the same set iterates differently on two replicas).
    """

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is set or kind is frozenset:
            ordered = sorted(obj, key=lambda item: _canonical_bytes(item, self._namespace))
            return (kind.__name__, tuple(ordered))
        return None


def _canonical_bytes(value: Any, namespace: Namespace) -> bytes:
    try:
        return serialize(value, namespace, canonical=True).to_bytes()
    except Exception:
        return repr(value).encode()


class NamespaceUnpickler(pickle.Unpickler):
    """Loads frames into `namespace`: notebook functions get it as their globals, and
    ``__main__.X`` references resolve in it (IPython's ``__main__`` is the user namespace)."""

    def __init__(self, file: BinaryIO, namespace: Namespace, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._namespace = namespace

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "user_namespace":
            return lambda: self._namespace
        if module == _cp.__name__ and name in _SKELETON_MAKERS:
            return functools.partial(_make_tracked_class, _SKELETON_MAKERS[name], self._namespace)
        if module == "__main__":
            head, *rest = name.split(".")
            if head in self._namespace:
                obj = self._namespace[head]
                for attr in rest:
                    obj = getattr(obj, attr)
                return obj
        return super().find_class(module, name)


_SKELETON_MAKERS = {
    "_make_skeleton_class": _cp._make_skeleton_class,
    "_make_skeleton_enum": _cp._make_skeleton_enum,
}
CLASS_REGISTRY_NAME = "__kernelfleet_classes__"


def class_registry(namespace: Namespace) -> weakref.WeakValueDictionary[str, type]:
    """The namespace's notebook classes by cloudpickle tracker id: those it pickled (it
    defined them) and those it unpickled. Lives in the namespace under a dunder name."""
    registry = namespace.get(CLASS_REGISTRY_NAME)
    if not isinstance(registry, weakref.WeakValueDictionary):
        registry = namespace[CLASS_REGISTRY_NAME] = weakref.WeakValueDictionary()
    return registry


def _make_tracked_class(maker: Any, namespace: Namespace, *args: Any) -> Any:
    """cloudpickle's skeleton-class maker, with class identity tracked per namespace.

    cloudpickle keeps one registry per process (class tracker id -> class), so that two
    pickles of one class load as one class. Keeping it per namespace instead (`class_registry`)
    gives the same guarantee per replica, including for an instance made on another replica of
    a class this one defined; and two replicas simulated in one process (tests) do not share,
    and overwrite, each other's classes.
    """
    *leading, tracker_id, extra = args
    new_class = maker(*leading, None, extra)
    if tracker_id is None:
        return new_class
    registry = class_registry(namespace)
    known = registry.get(tracker_id)
    if known is not None:
        return known
    registry[tracker_id] = new_class
    with _cp._DYNAMIC_CLASS_TRACKER_LOCK:  # re-pickled from here, it keeps its tracker id
        _cp._DYNAMIC_CLASS_TRACKER_BY_CLASS[new_class] = tracker_id
    return new_class


def serialize(value: Any, namespace: Namespace, *, canonical: bool = False) -> Frame:
    """Pickle `value` (a member of `namespace`) into a `Frame`; raises what pickling raises."""
    picklebuffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    pickler_class = CanonicalPickler if canonical else NamespacePickler
    pickler = pickler_class(stream, namespace, buffer_callback=picklebuffers.append)
    pickler.dump(value)
    return Frame(stream.getvalue(), tuple(_raw(pb) for pb in picklebuffers))


def _raw(picklebuffer: pickle.PickleBuffer) -> memoryview:
    try:
        return picklebuffer.raw()
    except BufferError:  # not contiguous: one copy is unavoidable
        return memoryview(memoryview(picklebuffer).tobytes())


def loads_frame(data: bytes | bytearray | memoryview, namespace: Namespace) -> Any:
    """Unpickle an inline frame. Buffers are copied once into writable memory (arrays that
    arrive must stay writable), which is cheap: inline frames are small."""
    view = memoryview(data).cast("B")
    main_len, lengths, offset = _parse_header(view)
    main = view[offset : offset + main_len]
    offset += main_len
    if offset + sum(lengths) != len(view):
        raise ObjectCorrupt(f"frame is {len(view)} bytes, its header says {offset + sum(lengths)}")
    buffers: list[memoryview] = []
    if lengths:
        writable = memoryview(bytearray(view[offset:]))
        start = 0
        for length in lengths:
            buffers.append(writable[start : start + length])
            start += length
    return NamespaceUnpickler(io.BytesIO(main), namespace, buffers=buffers).load()


def _parse_header(view: memoryview) -> tuple[int, list[int], int]:
    if len(view) < _FIXED.size:
        raise ObjectCorrupt(f"frame too short ({len(view)} bytes)")
    magic, count, main_len = _FIXED.unpack(view[: _FIXED.size])
    if magic != MAGIC or count > _MAX_BUFFERS:
        raise ObjectCorrupt(f"not a state-sync frame (magic {bytes(magic)!r}, {count} buffers)")
    end = _FIXED.size + 8 * count
    if len(view) < end:
        raise ObjectCorrupt("frame header truncated")
    lengths = list(struct.unpack(f"<{count}Q", view[_FIXED.size : end]))
    return main_len, lengths, end


def load_from_store(
    store: ObjectStore, key: str, namespace: Namespace, *, verify: bool = True
) -> tuple[Any, int]:
    """Fetch the frame stored under `key` and unpickle it; return (value, bytes read).

    Streams: each buffer is read straight into its own freshly allocated memory, which the
    unpickled arrays then use, so a 1 GB array costs 1 GB here, not 2 or 3. With `verify`, the
    bytes are hashed as they arrive and must match `key` (else `ObjectCorrupt`).
    `ObjectMissing` passes through.
    """
    hasher = hashlib.new(HASH_NAME) if verify else None
    with store.open(key) as stream:
        fixed = _read_exact(stream, _FIXED.size, hasher)
        magic, count, main_len = _FIXED.unpack(fixed)
        if magic != MAGIC or count > _MAX_BUFFERS:
            raise ObjectCorrupt(f"object {key} is not a state-sync frame")
        lengths = struct.unpack(f"<{count}Q", _read_exact(stream, 8 * count, hasher))
        total = _FIXED.size + 8 * count + main_len + sum(lengths)
        actual = stream.seek(0, io.SEEK_END)
        if actual != total:
            raise ObjectCorrupt(f"object {key} is {actual} bytes, its header says {total}")
        stream.seek(_FIXED.size + 8 * count)
        main = _read_exact(stream, main_len, hasher)
        buffers = [_read_buffer(stream, length, hasher) for length in lengths]
    if hasher is not None and hasher.hexdigest() != key:
        raise ObjectCorrupt(f"object {key} does not match its key (sha256 {hasher.hexdigest()})")
    value = NamespaceUnpickler(io.BytesIO(main), namespace, buffers=buffers).load()
    return value, total


def _read_exact(stream: BinaryIO, size: int, hasher: Any) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ObjectCorrupt(f"object truncated: wanted {size} bytes, got {len(data)}")
    if hasher is not None:
        hasher.update(data)
    return data


def _allocate(size: int) -> memoryview:
    """Uninitialised writable memory (numpy's empty: no zero-fill pass over a big buffer)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency
        return memoryview(bytearray(size))
    array: Any = numpy.empty(size, dtype=numpy.uint8)
    return memoryview(array)


def _read_buffer(stream: BinaryIO, size: int, hasher: Any) -> memoryview:
    target = _allocate(size)
    position = 0
    while position < size:
        piece = target[position : min(size, position + CHUNK_BYTES)]
        count = stream.readinto(piece)  # type: ignore[attr-defined]
        if not count:
            raise ObjectCorrupt(f"object truncated: buffer of {size} bytes ends at {position}")
        if hasher is not None:
            hasher.update(piece[:count])
        position += count
    return target


def _reduce_tensor(tensor: Any) -> Any:
    """Tensor -> (rebuild, (raw bytes out of band, dtype, shape, requires_grad)), or defer."""
    import torch

    if type(tensor) is torch.nn.Parameter:
        return (torch.nn.Parameter, (tensor.detach(), tensor.requires_grad))
    if (
        tensor.layout != torch.strided
        or tensor.is_quantized
        or getattr(tensor, "is_nested", False)
        or tensor.device.type == "meta"
        or (tensor.requires_grad and not tensor.is_leaf)
    ):
        return NotImplemented  # torch's own pickling (or its error) applies
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    buffer = pickle.PickleBuffer(data)
    return (_rebuild_tensor, (buffer, tensor.dtype, tuple(tensor.shape), tensor.requires_grad))


def _reduce_stateful_loader(loader: Any) -> Any:
    """A torchdata StatefulDataLoader -> (rebuild, (class, attributes, position)). Its live
    iterator does not pickle (a loader that has yielded a batch would never sync); its position
    (``state_dict()``) does, and the follower's loader goes on from there."""
    attributes = {k: v for k, v in vars(loader).items() if k != "_iterator"}
    return (_rebuild_stateful_loader, (type(loader), attributes, loader.state_dict()))


def _rebuild_stateful_loader(cls: Any, attributes: dict[str, Any], position: Any) -> Any:
    loader = cls.__new__(cls)
    vars(loader).update(attributes, _iterator=None)
    loader.load_state_dict(position)
    return loader


def _rebuild_tensor(buffer: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    raw = memoryview(buffer).cast("B")
    if len(raw) == 0:
        flat = torch.empty(0, dtype=torch.uint8)
    elif raw.readonly:
        flat = torch.tensor(bytearray(raw), dtype=torch.uint8)
    else:
        flat = torch.frombuffer(raw, dtype=torch.uint8)
    tensor = flat.view(dtype).reshape(shape)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor
