"""A plan's stages as pieces of the notebook's model, and the trained pieces put back.

The layers of a ``torch.nn.Sequential``-like model are its children in order, numbered from 0 as
the profiler numbers them; a stage ``(first, last)`` (both inclusive) is a ``Sequential`` of the
model's own children ``first..last`` (the same module objects, not copies: a run sends them to
its workers, which is where they are copied).

Replication: a PipeDream plan may give a stage several replicas (data-parallel copies),
``[0, 14] x3 + [15, 39] x1`` say, and text may too: ``"0-14x3,15-39"``. A run gives each
replica its own worker (`replicated`); `without_replicas` drops them instead, each stage then
running once, and notes what was dropped (the magic prints it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest

Range = tuple[int, int]


@dataclass(frozen=True)
class StageSplit:
    """Stage ranges in pipeline order, each stage's replica count, and what of the plan the
    run leaves out (printed)."""

    ranges: tuple[Range, ...]
    replicas: tuple[int, ...]
    notes: tuple[str, ...] = ()


def stage_ranges(plan: Any) -> StageSplit:
    """The ranges and replica counts of a planner `Plan`'s stages."""
    ranges = tuple((stage.first, stage.last) for stage in plan.stages)
    return StageSplit(ranges, tuple(stage.replicas for stage in plan.stages))


def without_replicas(split: StageSplit) -> StageSplit:
    """``split`` with one replica per stage, noting the replicas it drops (if any)."""
    dropped = [
        f"stage {index} (layers {first}-{last}) x{count}"
        for index, ((first, last), count) in enumerate(
            zip(split.ranges, split.replicas, strict=True)
        )
        if count > 1
    ]
    notes = split.notes
    if dropped:
        notes += (f"replicas not run (--no-replicas): {', '.join(dropped)}; each stage runs once",)
    return StageSplit(split.ranges, (1,) * len(split.ranges), notes)


def parse_stages(text: str) -> StageSplit:
    """``"0-2x2,3,4-6"`` as ranges ``((0, 2), (3, 3), (4, 6))`` with replicas ``(2, 1, 1)``
    (``xR``: R replicas, 1 without); `InvalidRequest` for anything else."""
    ranges: list[Range] = []
    replicas: list[int] = []
    for part in text.split(","):
        span, times, count = part.strip().partition("x")
        first, _, last = span.partition("-")
        if (
            not first.isdigit()
            or not (last or first).isdigit()
            or (times and not (count.isdigit() and int(count) >= 1))
        ):
            raise InvalidRequest(
                f"bad stages {text!r}: expected FIRST-LAST[xREPLICAS],... e.g. 0-2x2,3-5"
            )
        ranges.append((int(first), int(last or first)))
        replicas.append(int(count) if times else 1)
    return StageSplit(tuple(ranges), tuple(replicas))


def parse_ranges(text: str) -> tuple[Range, ...]:
    """``"0-2,3,4-6"`` as ``((0, 2), (3, 3), (4, 6))``; `InvalidRequest` for anything else,
    replicas (``0-2x2``) included."""
    split = parse_stages(text)
    if set(split.replicas) != {1}:
        raise InvalidRequest(f"bad stages {text!r}: replicas are not taken here")
    return split.ranges


def layers_of(model: Any) -> list[Any]:
    """The model's layers (its children, in order); `InvalidRequest` if it has none."""
    layers = list(model.children()) if hasattr(model, "children") else []
    if not layers:
        raise InvalidRequest("run a model made of layers: a torch.nn.Sequential, say")
    return layers


def check_ranges(ranges: tuple[Range, ...], layer_count: int) -> None:
    """Raise `InvalidRequest` unless ``ranges`` cover layers ``0..layer_count - 1`` in order."""
    expected = 0
    for first, last in ranges:
        if first != expected or last < first:
            raise InvalidRequest(
                f"stages must cover the layers in order from 0: got {_show(ranges)}"
            )
        expected = last + 1
    if expected != layer_count:
        raise InvalidRequest(
            f"the stages cover layers 0-{expected - 1} but the model has {layer_count} layers "
            f"(a plan from another model's profile?)"
        )


def split_model(model: Any, ranges: tuple[Range, ...]) -> list[Any]:
    """One ``torch.nn.Sequential`` per stage, of the model's own layers (not copies)."""
    import torch

    layers = layers_of(model)
    check_ranges(ranges, len(layers))
    return [torch.nn.Sequential(*layers[first : last + 1]) for first, last in ranges]


def write_back(model: Any, ranges: tuple[Range, ...], states: dict[int, dict[str, Any]]) -> None:
    """Load each stage's trained ``state_dict`` (keyed by stage index) into the model's layers,
    in place: afterwards the notebook's model holds the trained weights."""
    pieces = split_model(model, ranges)
    missing = sorted(set(range(len(pieces))) - set(states))
    if missing:
        raise InvalidRequest(f"no trained weights came back for stages {missing}")
    for index, piece in enumerate(pieces):
        piece.load_state_dict(states[index])


def _show(ranges: tuple[Range, ...]) -> str:
    return ",".join(f"{first}-{last}" for first, last in ranges)
