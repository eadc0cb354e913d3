"""The knobs the energy tuner turns and the search space they span.

A `Knob` is one setting the tuner may change, with every value it may take (sorted, ascending)
and the value it has when nobody tuned it (its default). A `SearchSpace` is the knobs of one
tuning run; a `Setting` maps each of its knob names to one of that knob's values. The tuner
searches over value *positions* (0 .. len(values) - 1), not raw values, so a clock list of
uneven steps and a batch list of powers of two are both searched on an even, ordered scale.

Knob names are the same for every backend (`KNOB_NAMES`); a backend offers those it can turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from kernelfleet.tools.energy.errors import UnknownKnob

GPU_CLOCK = "gpu_clock"
MEM_CLOCK = "mem_clock"
POWER_LIMIT = "power_limit"
BATCH = "batch"

KNOB_NAMES = (GPU_CLOCK, MEM_CLOCK, POWER_LIMIT, BATCH)
"""Every knob any backend may offer, in the order settings are shown."""

UNITS = {GPU_CLOCK: "MHz", MEM_CLOCK: "MHz", POWER_LIMIT: "W", BATCH: ""}

Setting = Mapping[str, float]
"""One value per knob of a search space, by knob name."""


@dataclass(frozen=True)
class Knob:
    """A knob: its `name` (one of `KNOB_NAMES`), every value it may take (`values`, sorted
    ascending, no repeats) and its untuned `default` (one of `values`)."""

    name: str
    values: tuple[float, ...]
    default: float

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"the knob {self.name!r} has no values")
        if list(self.values) != sorted(set(self.values)):
            raise ValueError(f"the values of {self.name!r} must be sorted and distinct")
        if self.default not in self.values:
            raise ValueError(f"the default of {self.name!r} is not one of its values")

    def position(self, value: float) -> int:
        """Where `value` sits in `values`; raises ValueError for a value it cannot take."""
        return self.values.index(value)


@dataclass(frozen=True)
class SearchSpace:
    """The knobs of one tuning run, in `KNOB_NAMES` order."""

    knobs: tuple[Knob, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(knob.name for knob in self.knobs)

    @property
    def size(self) -> int:
        """How many settings the space holds (the grid's size)."""
        size = 1
        for knob in self.knobs:
            size *= len(knob.values)
        return size

    def default(self) -> dict[str, float]:
        """The untuned setting: every knob at its default."""
        return {knob.name: knob.default for knob in self.knobs}

    def setting(self, positions: Sequence[int]) -> dict[str, float]:
        """The setting at `positions` (one per knob, in `knobs` order)."""
        return {k.name: k.values[p] for k, p in zip(self.knobs, positions, strict=True)}

    def positions(self, setting: Setting) -> tuple[int, ...]:
        """The positions of `setting`'s values (the inverse of `setting`)."""
        return tuple(knob.position(setting[knob.name]) for knob in self.knobs)

    def grid(self) -> Iterator[dict[str, float]]:
        """Every setting of the space."""
        for positions in itertools.product(*(range(len(k.values)) for k in self.knobs)):
            yield self.setting(positions)


def select(offered: Sequence[Knob], wanted: Sequence[str] | None, backend: str) -> SearchSpace:
    """The search space of the `wanted` knob names among those a backend `offered` (all of
    them when `wanted` is None). Raises `UnknownKnob`, naming what `backend` offers, for a name
    it does not offer."""
    by_name = {knob.name: knob for knob in offered}
    names = list(by_name) if wanted is None else list(dict.fromkeys(wanted))
    unknown = [name for name in names if name not in by_name]
    if unknown:
        has = ", ".join(by_name) or "no knobs"
        raise UnknownKnob(f"{backend} has no knob {', '.join(map(repr, unknown))}: it offers {has}")
    if not names:
        raise UnknownKnob(f"no knob to tune: {backend} offers {', '.join(by_name)}")
    ordered = sorted(names, key=KNOB_NAMES.index)
    return SearchSpace(tuple(by_name[name] for name in ordered))


def describe(setting: Setting) -> str:
    """A setting for people: ``power_limit 150 W, batch 64``."""
    parts = []
    for name in sorted(setting, key=lambda n: KNOB_NAMES.index(n) if n in KNOB_NAMES else 99):
        value = setting[name]
        shown = f"{value:g}"
        unit = UNITS.get(name, "")
        parts.append(f"{name} {shown}{' ' + unit if unit else ''}")
    return ", ".join(parts)
