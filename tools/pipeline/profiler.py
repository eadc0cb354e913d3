"""Measure a model layer by layer: the profile PipeDream's planner needs, from a sample batch.

`profile_model` takes a ``torch.nn.Sequential``-like model (its children, in order, are the
layers, each called once per forward pass and each taking what the previous one returned, as a
Sequential's are) and one sample batch, and calls the model on it. A forward hook on each
layer cuts the autograd graph after it, handing the next layer a fresh copy of the output that
keeps its own gradient, so that the backward pass can then be run and timed one layer at a time,
from the last to the first. (Module backward hooks cannot be used for that: they fail on layers
that work in place, such as ``ReLU(inplace=True)``, which most vision models have.)

Each layer's forward and backward times are the median over ``repeats`` measured passes, after
``warmup`` passes that are not measured; on a CUDA device each timing synchronises the device.
The activation size is the layer's output in bytes (all tensors of a tuple output), the
parameter size its parameters' bytes (each shared parameter counted once, at its first layer).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.profiles import LayerProfile, ModelProfile


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _cut(value: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """``value`` with every tensor that carries a gradient replaced by a copy starting a new
    autograd graph; returns it and the pairs (tensor, leaf): the leaf's ``.grad`` will hold the
    gradient that flows back into the tensor."""
    import torch

    leaves: list[tuple[Any, Any]] = []

    def cut(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            if not item.requires_grad:
                return item
            leaf = item.detach().requires_grad_(True)
            leaves.append((item, leaf))
            return leaf.clone()  # not a leaf, so an in-place next layer may modify it
        if isinstance(item, (tuple, list)):
            return type(item)(cut(x) for x in item)
        if isinstance(item, dict):
            return {key: cut(x) for key, x in item.items()}
        return item

    return cut(value), leaves


class _Pass:
    """One forward pass with the graph cut after every layer, then its backward, layer by layer."""

    def __init__(self, layers: list[Any], sync: Callable[[], None]) -> None:
        self.layers = layers
        self.sync = sync
        self.outputs: list[Any] = []
        self.cuts: list[list[tuple[Any, Any]]] = []  # per layer: (its output, the next leaf)
        self.forward_s: list[float] = []
        self.started = 0.0

    def before(self, module: Any, args: Any) -> None:
        self.sync()
        self.started = time.perf_counter()

    def after(self, module: Any, args: Any, output: Any) -> Any:
        self.sync()
        self.forward_s.append(time.perf_counter() - self.started)
        self.outputs.append(output)
        cut, pairs = _cut(output)
        self.cuts.append(pairs)
        return cut

    def backward(self, loss_of: Callable[[Any], Any]) -> list[float]:
        """Backward time of each layer, first layer first."""
        import torch

        times = [0.0] * len(self.layers)
        for index in reversed(range(len(self.layers))):
            output = self.outputs[index]
            if index == len(self.layers) - 1:
                roots, grads = [loss_of(output)], [None]
            else:
                pairs = [(t, leaf.grad) for t, leaf in self.cuts[index] if leaf.grad is not None]
                roots, grads = [p[0] for p in pairs], [p[1] for p in pairs]
            self.sync()
            started = time.perf_counter()
            if roots:
                torch.autograd.backward(roots, grads)
            self.sync()
            times[index] = time.perf_counter() - started
        return times


def profile_model(
    model: Any,
    sample: Any,
    *,
    loss: Callable[[Any], Any] | None = None,
    repeats: int = 3,
    warmup: int = 1,
) -> ModelProfile:
    """Forward and backward time, output and parameter bytes of each child of ``model``.

    ``sample`` is one minibatch (a tensor, or a tuple of them, the first layer's arguments).
    ``loss`` turns the last layer's output into the scalar the backward pass starts from; by
    default the sum of the output. The model's parameter gradients are left as they were.
    """
    import torch

    layers = list(model.children()) if hasattr(model, "children") else []
    if not layers:
        raise InvalidRequest(
            "profile a model made of layers: a torch.nn.Sequential, or a module whose children "
            "run one after another"
        )
    if repeats < 1 or warmup < 0:
        raise InvalidRequest(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    loss_of = loss or (lambda output: sum(t.float().sum() for t in _tensors(output)))
    parameters = list(model.parameters())
    device = parameters[0].device if parameters else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    saved = [None if p.grad is None else p.grad.clone() for p in parameters]
    forward: list[list[float]] = []
    backward: list[list[float]] = []
    outputs: list[Any] = []
    try:
        for iteration in range(warmup + repeats):
            measured = _one_pass(model, layers, sample, sync)
            if iteration >= warmup:
                forward.append(measured.forward_s)
                backward.append(measured.backward(loss_of))
                outputs = measured.outputs
            else:
                measured.backward(loss_of)
    finally:
        for parameter, grad in zip(parameters, saved, strict=True):
            parameter.grad = grad
    seen: set[int] = set()
    profiled = []
    for index, layer in enumerate(layers):
        own = [p for p in layer.parameters() if id(p) not in seen]
        seen.update(id(p) for p in own)
        profiled.append(
            LayerProfile(
                name=str(index),
                description=_describe(layer),
                forward_s=statistics.median(run[index] for run in forward),
                backward_s=statistics.median(run[index] for run in backward),
                activation_bytes=float(_nbytes(outputs[index])),
                parameter_bytes=float(sum(p.numel() * p.element_size() for p in own)),
            )
        )
    return ModelProfile.chain(profiled, source=type(model).__name__)


def _one_pass(model: Any, layers: list[Any], sample: Any, sync: Callable[[], None]) -> _Pass:
    measured = _Pass(layers, sync)
    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(measured.before))
        handles.append(layer.register_forward_hook(measured.after))
    try:
        model(*sample) if isinstance(sample, tuple) else model(sample)
    finally:
        for handle in handles:
            handle.remove()
    if len(measured.forward_s) != len(layers):
        raise InvalidRequest("a layer was called more than once or not at all in one pass")
    return measured


def _describe(layer: Any) -> str:
    text = " ".join(repr(layer).split())
    return text if len(text) <= 80 else text[:77] + "..."
