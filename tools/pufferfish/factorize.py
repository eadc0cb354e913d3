"""Walk a model, choose the layers to factorise, and swap them for factorised pairs.

`plan_factorization` is pure: it reads the model and returns a frozen `FactorizationPlan`, one
`LayerChoice` per candidate layer in ``named_modules()`` order (the order the modules were
registered, which for a model written top to bottom is the order of its forward pass). Candidates:

- every ``nn.Linear`` and every ``nn.Conv2d`` with ``groups=1``, wherever it sits, the FFN
  matrices of ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` (``linear1``, ``linear2``)
  included;
- kept full, with the reason in the plan: a Conv2d with ``groups > 1`` (a depthwise convolution
  has no matrix to factorise), a layer whose weight is shared with another module (tied
  weights), and each ``nn.MultiheadAttention``: its forward hands ``in_proj_weight`` and
  ``out_proj.weight`` to ``F.multi_head_attention_forward`` directly, so a swapped submodule
  would be ignored or break it. Attention stays full rank; only the FFN is factorised;
- kept full as the user asks, through `keep_full` tokens: ``first`` and ``last`` (the first and
  last candidates: Pufferfish keeps a network's first and last layers full), ``first:K`` (the
  first K candidates, Pufferfish's hybrid networks), ``none``, or a module name, which keeps that
  module and every candidate under it (``layer1`` keeps ``layer1.0.conv1`` ...).

`factorize` applies a plan in place: each chosen layer's parent gets the factorised pair under
the same attribute name, SVD-initialised from the layer (`layers`). The model object stays the
same, so a notebook's variable sees the change; only a model that is itself one layer is
replaced (`Factorization.model`). Optimizers built before hold the old weights: see
`warmup.move_optimizer`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from kernelfleet.tools.pufferfish.counts import allreduce_bytes, conv2d_params, linear_params
from kernelfleet.tools.pufferfish.errors import NothingToFactorize
from kernelfleet.tools.pufferfish.layers import (
    FactorizedConv2d,
    FactorizedLinear,
    check_ratio,
    full_rank,
    rank_for,
)

DEFAULT_KEEP_FULL = ("first", "last")
ATTENTION_KEPT = "attention, kept full: reads in_proj_weight itself"


@dataclass(frozen=True)
class LayerChoice:
    """One candidate layer: where it is, its weight's shape, and the rank it gets (None: kept
    full, `why_full` says why). Parameter counts are closed form (`counts`) for Linear and
    Conv2d (groups 1); `own_params` is what any layer holds, counted, and stands for the layers
    with no closed form here (attention, grouped convolutions). Trainable layers are assumed."""

    name: str
    kind: str
    shape: tuple[int, ...]
    bias: bool
    element_size: int
    full_rank: int
    rank: int | None
    why_full: str = ""
    own_params: int = field(default=0, compare=False)

    @property
    def params_before(self) -> int:
        return self._params(None)

    @property
    def params_after(self) -> int:
        return self._params(self.rank)

    def _params(self, rank: int | None) -> int:
        if self.kind == "Linear":
            return linear_params(self.shape[0], self.shape[1], self.bias, rank)
        if self.kind == "Conv2d" and self.full_rank:
            kernel = (self.shape[2], self.shape[3])
            return conv2d_params(self.shape[0], self.shape[1], kernel, self.bias, rank)
        return self.own_params


@dataclass(frozen=True)
class FactorizationPlan:
    """The layers of a model and their ranks at `ratio`; `other_params` and `other_bytes` are
    the trainable parameters outside every candidate layer (norms, embeddings...), which a
    factorisation leaves as they are."""

    ratio: float
    layers: tuple[LayerChoice, ...]
    other_params: int
    other_bytes: int

    @property
    def factorized(self) -> tuple[LayerChoice, ...]:
        return tuple(layer for layer in self.layers if layer.rank is not None)

    @property
    def params_before(self) -> int:
        return self.other_params + sum(layer.params_before for layer in self.layers)

    @property
    def params_after(self) -> int:
        return self.other_params + sum(layer.params_after for layer in self.layers)

    @property
    def bytes_before(self) -> int:
        """All-reduce payload per DDP step, full rank (`counts`)."""
        return self.other_bytes + sum(c.params_before * c.element_size for c in self.layers)

    @property
    def bytes_after(self) -> int:
        """All-reduce payload per DDP step once factorised (`counts`)."""
        return self.other_bytes + sum(c.params_after * c.element_size for c in self.layers)


@dataclass
class Factorization:
    """What `factorize` did: the `plan`, the `model` (the same object unless it was one layer)
    and, for each replaced weight, the parameters that now stand for it (V^T's, then U's)."""

    plan: FactorizationPlan
    model: nn.Module
    replaced: dict[torch.Tensor, tuple[torch.Tensor, ...]]


def plan_factorization(
    model: nn.Module, ratio: float, keep_full: Sequence[str] = DEFAULT_KEEP_FULL
) -> FactorizationPlan:
    """The plan for `model` at rank `ratio` (0 < ratio <= 1, else ValueError) keeping full what
    `keep_full` names (module docstring; an unknown name is a ValueError listing the layers)."""
    check_ratio(ratio)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError(
            "give the module inside DistributedDataParallel (.module), then wrap "
            "the factorised model again: DDP's buckets hold the old parameters"
        )
    shared = _shared_parameters(model)
    found: list[tuple[str, nn.Module, str]] = []  # name, layer, why it stays full ("" if not)
    covered: set[int] = set()
    for name, module in model.named_modules():
        if any(id(p) in covered for p in module.parameters(recurse=False)):
            continue
        if isinstance(module, nn.MultiheadAttention | FactorizedLinear | FactorizedConv2d):
            covered.update(id(p) for p in module.parameters())
            if isinstance(module, nn.MultiheadAttention):
                found.append((name, module, ATTENTION_KEPT))
            continue
        if isinstance(module, nn.Linear | nn.Conv2d):
            covered.update(id(p) for p in module.parameters())
            why = ""
            if isinstance(module, nn.Conv2d) and module.groups != 1:
                why = f"groups={module.groups}"
            elif id(module.weight) in shared:
                why = "weight shared with another module"
            found.append((name, module, why))
    kept = _kept_by_user([name for name, _, why in found if not why], keep_full)
    layers = tuple(
        _choice(name, layer, ratio, why or kept.get(name, "")) for name, layer, why in found
    )
    others = [p for p in model.parameters() if id(p) not in covered]
    other_bytes = allreduce_bytes(others)
    other_params = sum(p.numel() for p in {id(p): p for p in others if p.requires_grad}.values())
    return FactorizationPlan(ratio, layers, other_params, other_bytes)


def factorize(
    model: nn.Module, ratio: float, keep_full: Sequence[str] = DEFAULT_KEEP_FULL
) -> Factorization:
    """Factorise `model` in place at `ratio` with SVD initialisation (module docstring).
    Raises `NothingToFactorize` when the plan chooses no layer, ValueError for a bad ratio or
    keep-full name."""
    plan = plan_factorization(model, ratio, keep_full)
    if not plan.factorized:
        raise NothingToFactorize(_nothing_message(plan))
    replaced: dict[torch.Tensor, tuple[torch.Tensor, ...]] = {}
    for choice in plan.factorized:
        assert choice.rank is not None
        parent, attribute = _parent(model, choice.name)
        layer = model.get_submodule(choice.name)
        pair: FactorizedLinear | FactorizedConv2d
        if isinstance(layer, nn.Linear):
            pair = FactorizedLinear.from_full(layer, choice.rank)
        else:
            assert isinstance(layer, nn.Conv2d)
            pair = FactorizedConv2d.from_full(layer, choice.rank)
        pair.train(layer.training)
        for factor in (pair.v.weight, pair.u.weight):
            factor.requires_grad_(layer.weight.requires_grad)
        replaced[layer.weight] = (pair.v.weight, pair.u.weight)
        if parent is None:
            model = pair
        else:
            setattr(parent, attribute, pair)
            if isinstance(parent, nn.TransformerEncoderLayer):
                _keep_off_fast_path(parent)
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoder) and _fast_path_off in _pre_hooks(module):
            module.use_nested_tensor = False
    return Factorization(plan, model, replaced)


def _choice(name: str, layer: nn.Module, ratio: float, why_full: str) -> LayerChoice:
    if isinstance(layer, nn.MultiheadAttention):
        count = sum(p.numel() for p in layer.parameters())
        size = next((p.element_size() for p in layer.parameters()), 4)
        return LayerChoice(
            name,
            "MultiheadAttention",
            (layer.embed_dim, layer.embed_dim),
            False,
            size,
            0,
            None,
            why_full,
            own_params=count,
        )
    assert isinstance(layer, nn.Linear | nn.Conv2d)
    weight = layer.weight
    kind = "Linear" if isinstance(layer, nn.Linear) else "Conv2d"
    full = full_rank(layer) if not why_full.startswith("groups") else 0
    rank = None if why_full else rank_for(full, ratio)
    own = sum(p.numel() for p in layer.parameters())
    return LayerChoice(
        name,
        kind,
        tuple(weight.shape),
        layer.bias is not None,
        weight.element_size(),
        full,
        rank,
        why_full,
        own_params=own,
    )


def _kept_by_user(names: list[str], keep_full: Iterable[str]) -> dict[str, str]:
    """Layer name -> why the user keeps it full, from the `keep_full` tokens."""
    kept: dict[str, str] = {}
    for token in (t.strip() for t in keep_full):
        if token in ("", "none"):
            continue
        if token in ("first", "last") and names:
            kept.setdefault(names[0 if token == "first" else -1], f"kept full: {token}")
            continue
        if token.startswith("first:"):
            count = token.partition(":")[2]
            if not count.isdigit():
                raise ValueError(f"keep-full {token}: expected first:K, K a whole number")
            for name in names[: int(count)]:
                kept.setdefault(name, f"kept full: {token}")
            continue
        matches = [n for n in names if n == token or n.startswith(token + ".")]
        if not matches and token not in ("first", "last"):
            listed = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
            raise ValueError(f"keep-full {token}: no such layer (layers: {listed or 'none'})")
        for name in matches:
            kept.setdefault(name, f"kept full: {token}")
    return kept


def _shared_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters that more than one module holds (tied weights)."""
    owners = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    return {key for key, count in owners.items() if count > 1}


def _parent(model: nn.Module, name: str) -> tuple[nn.Module | None, str]:
    if not name:
        return None, ""
    parent_name, _, attribute = name.rpartition(".")
    return model.get_submodule(parent_name), attribute


def _nothing_message(plan: FactorizationPlan) -> str:
    if not plan.layers:
        return "nothing to factorise: the model has no Linear or Conv2d layer"
    why = "; ".join(f"{c.name or '(the model)'}: {c.why_full}" for c in plan.layers)
    return f"nothing to factorise: every layer stays full rank ({why})"


def _fast_path_off(module: nn.Module, args: tuple[object, ...]) -> None:
    """A forward pre-hook that does nothing: its presence turns off the fused fast path of
    ``nn.TransformerEncoderLayer`` (taken in eval mode without gradients), which reads
    ``linear1.weight`` and ``linear2.weight`` directly, so the factorised FFN runs instead.
    (An ``nn.TransformerEncoder`` holding such a layer reads them too, to decide on nested
    tensors; `factorize` turns its ``use_nested_tensor`` off.)"""
    return None


def _keep_off_fast_path(layer: nn.TransformerEncoderLayer) -> None:
    if _fast_path_off not in _pre_hooks(layer):
        layer.register_forward_pre_hook(_fast_path_off)


def _pre_hooks(module: nn.Module) -> list[object]:
    """The forward pre-hooks of `module` and of every module under it."""
    return [hook for m in module.modules() for hook in m._forward_pre_hooks.values()]


def compression(plan: FactorizationPlan) -> float:
    """Parameters before over after (above 1: the factorised model is smaller)."""
    return plan.params_before / plan.params_after if plan.params_after else math.inf
