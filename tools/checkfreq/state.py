"""What a checkpoint holds: the training objects found in a namespace, RNG states and the step.

`find_objects` picks, by variable name, every ``torch.nn.Module``, ``torch.optim.Optimizer``,
LR scheduler and torchdata ``StatefulDataLoader`` of a namespace (names starting with ``_`` are
skipped). A checkpoint of step ``n`` holds the state of the loop between step ``n``'s update and
step ``n + 1``'s first use of data or randomness. It is taken in two moments:

- `capture`, right after step ``n``'s ``optimizer.step`` (in the loop's thread): modules and
  optimizers through ``torch.distributed.checkpoint.state_dict`` (keys by parameter name; the
  tensors are references, which the checkpoint's stager copies in the background: parameters
  and optimizer state change only in ``optimizer.step``, which the snapshot guard holds until the
  copy is done; a module's buffers are cloned here, since a forward pass in training mode changes
  some, batch norm's running statistics), the data loaders' positions, the RNG states and ``n``;
- `capture_late`, right before step ``n + 1``'s ``optimizer.step`` (or when the loop ends): the
  LR schedulers, which a loop steps after the optimizer (their step ``n`` is done only then),
  and the optimizers' hyperparameters, whose learning rates those schedulers set.

`restore` loads such a checkpoint back into the objects of the same names.
"""

from __future__ import annotations

import copy
import io
import pickle
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from kernelfleet.tools.checkfreq.errors import CheckpointError

MODULE, OPTIMIZER, SCHEDULER, LOADER = "module", "optimizer", "scheduler", "loader"
PARAM_GROUPS = "param_groups"


def quiet_single_process() -> None:
    """torch.distributed.checkpoint warns on every call that no process group is set up: here
    that is the intent (one process). Filters are process-wide, so this covers its threads."""
    warnings.filterwarnings(
        "ignore", message=r"torch\.distributed is disabled", category=UserWarning
    )
    warnings.filterwarnings("ignore", message=r".*assuming the intent is", category=UserWarning)


def kind_of(value: Any) -> str | None:
    if isinstance(value, torch.nn.Module):
        return MODULE
    if isinstance(value, torch.optim.Optimizer):
        return OPTIMIZER
    if isinstance(
        value, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau
    ):
        return SCHEDULER
    loader_type = _stateful_loader_type()
    if loader_type is not None and isinstance(value, loader_type):
        return LOADER
    return None


def _stateful_loader_type() -> type | None:
    try:
        from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
            StatefulDataLoader,
        )
    except ImportError:  # torchdata is optional: without it no loader is checkpointed
        return None
    return StatefulDataLoader


def find_objects(namespace: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """name -> (kind, object) for every checkpointable object of `namespace`, by name."""
    found = {}
    for name, value in sorted(namespace.items()):
        if name.startswith("_"):
            continue
        kind = kind_of(value)
        if kind is not None:
            found[name] = (kind, value)
    return found


def owner_of(optimizer: torch.optim.Optimizer, modules: dict[str, torch.nn.Module]) -> str:
    """The name of the module whose parameters include all of `optimizer`'s (the smallest such);
    raises `CheckpointError` when none does (its state could not be keyed by parameter name)."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    covering = []
    for name, module in modules.items():
        own = {id(p) for p in module.parameters()}
        if wanted <= own:
            covering.append((len(own), name))
    if not covering:
        raise CheckpointError(
            "an optimizer updates parameters of no module in the namespace: bind the model to a "
            "variable so its state can be checkpointed"
        )
    return min(covering)[1]


EXTRA = "extra.pt"
"""The file, beside torch.distributed.checkpoint's, with the state that is not tensors."""


@dataclass(frozen=True)
class Captured:
    """A step's state: `tensors` for torch.distributed.checkpoint, `extra` (step, RNG states,
    loader positions: copies) for `extra_bytes`, and what `restore` needs to know about it
    (`kinds`: name -> kind; `owners`: optimizer name -> module name)."""

    tensors: dict[str, Any]
    extra: dict[str, Any]
    kinds: dict[str, str]
    owners: dict[str, str]


def capture(namespace: dict[str, Any], step: int) -> Captured:
    """The state of the objects of `namespace` at `step` (see the module docstring). Raises
    `CheckpointError`, naming the variable, for an object whose state cannot be taken."""
    objects = find_objects(namespace)
    modules = {n: o for n, (k, o) in objects.items() if k == MODULE}
    kinds = {n: k for n, (k, _) in objects.items()}
    owners: dict[str, str] = {}
    model_states: dict[str, Any] = {}
    optim_states: dict[str, Any] = {}
    extra: dict[str, Any] = {"step": step, "rng": rng_state(), LOADER: {}}
    for name, (kind, obj) in objects.items():
        try:
            if kind == MODULE:
                model_states[name] = _module_state(obj)
            elif kind == OPTIMIZER:
                owners[name] = owner_of(obj, modules)
                optim_states[name] = get_optimizer_state_dict(modules[owners[name]], obj)
            elif kind == LOADER:
                extra[LOADER][name] = copy.deepcopy(obj.state_dict())
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"cannot snapshot {name!r} ({kind}): {_one_line(e)}") from e
    tensors = {"modules": model_states, "optimizers": optim_states}
    return Captured(tensors, extra, kinds, owners)


def capture_late(namespace: dict[str, Any], kinds: dict[str, str]) -> dict[str, Any]:
    """The schedulers among `kinds` (as `capture` found them), from `namespace` now, and the
    optimizers' hyperparameters (a scheduler's step sets their learning rates)."""
    schedulers, groups = {}, {}
    for name, kind in kinds.items():
        obj: Any = namespace.get(name)
        if kind == SCHEDULER and kind_of(obj) == SCHEDULER:
            schedulers[name] = copy.deepcopy(obj.state_dict())
        elif kind == OPTIMIZER and kind_of(obj) == OPTIMIZER:
            groups[name] = [
                copy.deepcopy({k: v for k, v in group.items() if k != "params"})
                for group in obj.param_groups
            ]
    return {SCHEDULER: schedulers, PARAM_GROUPS: groups}


def extra_bytes(captured: Captured, late: dict[str, Any]) -> bytes:
    """The contents of `EXTRA` for `captured` and its `capture_late` part. Raises
    `CheckpointError` for a state that cannot be serialised."""
    try:
        buffer = io.BytesIO()
        torch.save({**captured.extra, **late}, buffer)
    except Exception as e:
        raise CheckpointError(f"cannot save the schedulers or loaders: {_one_line(e)}") from e
    return buffer.getvalue()


def _module_state(module: torch.nn.Module) -> dict[str, Any]:
    state = get_model_state_dict(module)
    params = {name for name, _ in module.named_parameters()}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            pickle.dumps(value)  # an extra state that cannot be saved fails here, by name
        elif value.is_meta:
            raise ValueError(f"{key} is on the meta device: it holds no data to save")
        elif key not in params:
            state[key] = value.detach().clone()
    return state


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy
    except ImportError:
        pass
    else:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore(
    namespace: dict[str, Any], path: Path, manifest: dict[str, Any]
) -> tuple[int, list[str]]:
    """Load the checkpoint in `path` (written by `capture`'s state, described by `manifest`)
    into the objects of `namespace` of the same names, and the RNG states. Returns the step and
    the names restored. Raises `CheckpointError` when a name is missing or of another kind."""
    import torch.distributed.checkpoint as dcp

    kinds: dict[str, str] = manifest["kinds"]
    owners: dict[str, str] = manifest["owners"]
    objects = find_objects(namespace)
    missing = [n for n, k in kinds.items() if objects.get(n, ("", None))[0] != k]
    if missing:
        wanted = ", ".join(f"{n} ({kinds[n]})" for n in missing)
        raise CheckpointError(f"the checkpoint needs these objects in the namespace: {wanted}")
    modules = {n: objects[n][1] for n, k in kinds.items() if k == MODULE}
    optimizers = {n: objects[n][1] for n, k in kinds.items() if k == OPTIMIZER}
    for optimizer in optimizers.values():
        if not optimizer.state:  # an empty state is initialised only where no grads are set
            optimizer.zero_grad(set_to_none=True)
    template: dict[str, Any] = {
        "modules": {n: get_model_state_dict(m) for n, m in modules.items()},
        "optimizers": {
            n: get_optimizer_state_dict(modules[owners[n]], o) for n, o in optimizers.items()
        },
    }
    quiet_single_process()
    try:
        dcp.load(template, checkpoint_id=str(path), no_dist=True)
    except Exception as e:
        raise CheckpointError(f"cannot read the checkpoint in {path}: {_one_line(e)}") from e
    for name, module in modules.items():
        set_model_state_dict(module, template["modules"][name])
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(modules[owners[name]], optimizer, template["optimizers"][name])
        optimizer.zero_grad(set_to_none=True)
    try:
        small = torch.load(path / EXTRA, weights_only=False)
    except Exception as e:
        raise CheckpointError(f"cannot read {path / EXTRA}: {_one_line(e)}") from e
    for name, groups in small[PARAM_GROUPS].items():
        for group, saved in zip(optimizers[name].param_groups, groups, strict=True):
            group.update(saved)
    for name, state in small[SCHEDULER].items():
        objects[name][1].load_state_dict(state)
    for name, state in small[LOADER].items():
        loader = objects[name][1]
        loader.load_state_dict(state)
        # Make its iterator now: making one draws seeds from torch's RNG (the sampler's, the
        # workers' base seed), draws the interrupted run made at the start of the epoch. The
        # loop's next iter(loader) gets this iterator, and the RNG states set below are intact.
        loader.state_dict()
    set_rng_state(small["rng"])
    return int(small["step"]), sorted(kinds)


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]
