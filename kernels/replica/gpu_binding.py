"""GPUs inside the replica kernel: bound while a cell runs, and device memory really freed when
the gateway reclaims them.

`GpuBinder` is used by the replica that executes a cell:

- `bind(device_ids)` before the cell: ``KERNELFLEET_GPUS`` holds the ids (comma-separated) and,
  if user code imported torch and CUDA is available, ``torch.cuda.set_device(first id)``.
  ``CUDA_VISIBLE_DEVICES`` is left alone: CUDA reads it once per process.
- `release(namespace)` when the GPUs are reclaimed: every torch tensor, ``nn.Module`` and
  optimizer state found in the user namespace that lives on an accelerator moves to host memory,
  then (once CUDA is in use) ``gc.collect()`` and ``torch.cuda.empty_cache()`` hand the
  memory back to the driver.
  ``KERNELFLEET_GPUS`` becomes empty.
- `reacquire(namespace, device_ids)` before the next cell: what `release` moved, and is still
  reachable from the namespace, goes back to the new devices. A tensor that sat on the k-th
  previously bound device goes to the k-th new one (the first if it sat on another device).

Moves are in place, as ``nn.Module.to`` moves parameters (``tensor.data`` and its ``.grad``
replaced), so every reference sees the moved tensor: aliases, tuples, closures, optimizers.
A module whose tensors sit on one device moves with ``module.to``; one spread over devices moves
tensor by tensor. Limits: views of a moved tensor keep their old storage (and that memory) alive;
the walk is bounded (below).

What is walked: the namespace's values (IPython's ``Out`` and ``_`` included), and inside dicts,
lists, tuples, sets and plain objects' ``__dict__`` two levels deep; modules are walked through
their parameters and buffers, optimizers through their state and parameter groups. A container
with more than ``max_items`` entries is skipped and named in the report. Nothing here imports
torch: without torch in ``sys.modules`` (user code never imported it) every call is a no-op.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import types
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.protocol import ReplicaEnv

log = logging.getLogger("kernelfleet.kernel.gpus")

ENV_VAR = ReplicaEnv.GPUS.value
HOST_DEVICE = "cpu"
MAX_DEPTH = 2
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


@dataclass(frozen=True)
class MoveReport:
    """What one `release` or `reacquire` moved: objects, bytes of tensor data and seconds."""

    tensors: int = 0
    modules: int = 0
    optimizers: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped: tuple[str, ...] = ()


@dataclass
class _Tally:
    tensors: int = 0
    modules: int = 0
    optimizers: int = 0
    bytes: int = 0

    def report(self, started: float, skipped: list[str]) -> MoveReport:
        return MoveReport(
            self.tensors,
            self.modules,
            self.optimizers,
            self.bytes,
            time.perf_counter() - started,
            tuple(skipped),
        )


@dataclass
class _Moved:
    obj: Any  # a tensor or a module, kept alive until it is reacquired or forgotten
    device: Any  # where it was


@dataclass
class _Found:
    modules: list[Any]
    optimizers: list[Any]
    tensors: list[Any]
    skipped: list[str]


class GpuBinder:
    """Binds device ids for a cell and moves the namespace's device memory off and back.

    ``is_accelerator(device)`` says whether a torch device is one to free (default: CUDA);
    ``device_for(device_id)`` turns a bound id into a torch device (default ``cuda:<id>``);
    ``torch`` replaces the ``sys.modules`` lookup (tests). Not thread-safe: the kernel's main
    thread calls it between cells.
    """

    def __init__(
        self,
        *,
        is_accelerator: Callable[[Any], bool] | None = None,
        device_for: Callable[[str], Any] | None = None,
        environ: MutableMapping[str, str] | None = None,
        torch: Any = None,
        max_items: int = 10_000,
    ) -> None:
        self._is_accelerator = is_accelerator or (lambda device: device.type == "cuda")
        self._device_for = device_for
        self._environ = os.environ if environ is None else environ
        self._torch = torch
        self.max_items = max_items
        self.bound: tuple[str, ...] = ()
        self._released_from: tuple[str, ...] = ()
        self._moved: dict[int, _Moved] = {}

    # ---- binding ---------------------------------------------------------------------------

    def bind(self, device_ids: Sequence[str]) -> None:
        """Make `device_ids` the cell's GPUs (see the module docstring)."""
        self.bound = tuple(str(device) for device in device_ids)
        self._environ[ENV_VAR] = ",".join(self.bound)
        torch = self._torch_module()
        if torch is None or not self.bound or not torch.cuda.is_available():
            return
        if self.bound[0].isdigit():
            torch.cuda.set_device(int(self.bound[0]))
        else:
            log.warning("cannot select GPU %r in torch: not a device index", self.bound[0])

    def release(self, namespace: dict[str, Any]) -> MoveReport:
        """Move accelerator tensors, modules and optimizer state to host memory; free the cache."""
        self._released_from = self.bound or self._released_from
        self.bound = ()
        self._environ[ENV_VAR] = ""
        torch = self._torch_module()
        if torch is None:
            return MoveReport()
        started = time.perf_counter()
        found = self._find(namespace, torch)
        tally = _Tally()
        done: set[int] = set()

        def offload(tensor: Any) -> None:
            if id(tensor) in done or not self._is_accelerator(tensor.device):
                return
            done.add(id(tensor))
            self._moved[id(tensor)] = _Moved(tensor, tensor.device)
            tally.bytes += _nbytes(tensor)
            tally.tensors += 1
            _move_tensor(tensor, HOST_DEVICE)

        for module in found.modules:
            tensors = [t for t in _module_tensors(module) if self._is_accelerator(t.device)]
            devices = {str(t.device) for t in tensors}
            if len(devices) == 1:
                self._moved[id(module)] = _Moved(module, tensors[0].device)
                tally.bytes += sum(_nbytes(t) for t in tensors)
                done.update(id(t) for t in tensors)
                module.to(HOST_DEVICE)
                tally.modules += 1
            else:
                for tensor in tensors:
                    offload(tensor)
        for optimizer in found.optimizers:
            before = tally.tensors
            for tensor in _optimizer_tensors(optimizer, torch):
                offload(tensor)
            tally.optimizers += tally.tensors > before
        for tensor in found.tensors:
            offload(tensor)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            gc.collect()  # cycles (a traceback's frames, say) may still hold device tensors
            torch.cuda.empty_cache()
        return tally.report(started, found.skipped)

    def reacquire(self, namespace: dict[str, Any], device_ids: Sequence[str]) -> MoveReport:
        """`bind(device_ids)`, then move what `release` moved and the namespace still reaches
        onto the new devices. What is no longer reachable is forgotten where it is."""
        self.bind(device_ids)
        torch = self._torch_module()
        moved, self._moved = self._moved, {}
        if torch is None or not moved:
            return MoveReport()
        if not self.bound:
            self._moved = moved
            return MoveReport(skipped=("no device bound: kept in host memory",))
        started = time.perf_counter()
        found = self._find(namespace, torch)
        reachable = {id(obj) for obj in [*found.modules, *found.tensors]}
        for module in found.modules:
            reachable.update(id(t) for t in _module_tensors(module))
        for optimizer in found.optimizers:
            reachable.update(id(t) for t in _optimizer_tensors(optimizer, torch))
        tally = _Tally()
        for key, entry in moved.items():
            if isinstance(entry.obj, torch.nn.Module):
                tensors = list(_module_tensors(entry.obj))
                if key in reachable or any(id(t) in reachable for t in tensors):
                    tally.bytes += sum(_nbytes(t) for t in tensors)
                    entry.obj.to(self._target(entry.device))
                    tally.modules += 1
            elif key in reachable:
                tally.bytes += _nbytes(entry.obj)
                _move_tensor(entry.obj, self._target(entry.device))
                tally.tensors += 1
        return tally.report(started, found.skipped)

    # ---- internals -------------------------------------------------------------------------

    def _torch_module(self) -> Any:
        return self._torch if self._torch is not None else sys.modules.get("torch")

    def _target(self, device: Any) -> Any:
        """The new device for something that sat on `device` (see the module docstring)."""
        index = getattr(device, "index", None)
        previous = self._released_from
        position = previous.index(str(index)) if str(index) in previous else 0
        device_id = self.bound[position % len(self.bound)]
        if self._device_for is not None:
            return self._device_for(device_id)
        return f"cuda:{device_id}"

    def _find(self, namespace: dict[str, Any], torch: Any) -> _Found:
        found = _Found([], [], [], [])
        seen: set[int] = set()
        for name, value in namespace.items():
            self._visit(name, value, 1, torch, found, seen)
        return found

    def _visit(
        self, path: str, value: Any, depth: int, torch: Any, found: _Found, seen: set[int]
    ) -> None:
        if id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None))):
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.tensors.append(value)
        elif isinstance(value, torch.nn.Module):
            found.modules.append(value)
        elif isinstance(value, torch.optim.Optimizer):
            found.optimizers.append(value)
        elif depth <= MAX_DEPTH and not isinstance(value, _OPAQUE):
            children = _children(value)
            if children is None:
                return
            if len(children) > self.max_items:
                found.skipped.append(f"{path} ({len(children)} items)")
                return
            for key, child in children:
                self._visit(f"{path}[{key!r}]", child, depth + 1, torch, found, seen)


def _children(value: Any) -> list[tuple[Any, Any]] | None:
    """The entries of a container or the attributes of a plain object; None for anything else."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if isinstance(value, (set, frozenset)):
        return [(i, item) for i, item in enumerate(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return list(attributes.items())
    return None


def _module_tensors(module: Any) -> Iterator[Any]:
    yield from module.parameters()
    yield from module.buffers()


def _optimizer_tensors(optimizer: Any, torch: Any) -> Iterator[Any]:
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value
    for group in optimizer.param_groups:
        yield from group["params"]


def _move_tensor(tensor: Any, device: Any) -> None:
    """Move in place, as ``nn.Module._apply`` does: every reference sees the new data."""
    tensor.data = tensor.data.to(device)
    if tensor.grad is not None:
        tensor.grad.data = tensor.grad.data.to(device)


def _nbytes(tensor: Any) -> int:
    return int(tensor.element_size() * tensor.nelement())
