"""What the tuner asks of a backend: `EnergyBackend`, and the `Measurement` it answers.

The tuner (`kernelfleet.tools.energy.tuner`) calls, in this order:

1. `EnergyBackend.space(knobs)` once: the knobs it will search (raises `UnknownKnob` for a
   name the backend cannot turn);
2. `EnergyBackend.measure(setting)` once per evaluation: put the setting in place, run the
   workload once, and return what it cost. A backend may raise `EnergyError` (the run stops);
3. `EnergyBackend.apply(setting)` with the best setting found, or `EnergyBackend.reset()`
   when none met the SLO or the run failed: what stays in place after the tuner returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kernelfleet.tools.energy.knobs import SearchSpace, Setting


@dataclass(frozen=True)
class GpuEnergy:
    """One GPU's share of a measurement: its index on the host and the joules it used."""

    index: int
    energy_j: float


@dataclass(frozen=True)
class Measurement:
    """What one run of the workload cost: wall `latency_s`, `energy_j` over every GPU (None
    when it could not be measured; `per_gpu` then is empty) and the work it did, `items`
    (samples in a batch, or 1): the tuner minimises ``energy_j / items``."""

    latency_s: float
    energy_j: float | None
    items: float = 1.0
    per_gpu: tuple[GpuEnergy, ...] = ()

    @property
    def energy_per_item_j(self) -> float | None:
        return None if self.energy_j is None else self.energy_j / self.items


class EnergyBackend(Protocol):
    """Something whose settings the tuner turns and whose runs it measures."""

    name: str
    """How the backend is named in messages (``"the replay of v100:imagenet/resnet50"``)."""

    deterministic: bool
    """Whether measuring one setting twice gives the same figures (a replay does)."""

    def space(self, knobs: Sequence[str] | None = None) -> SearchSpace:
        """The search space over the `knobs` named (every knob offered when None)."""
        ...

    def measure(self, setting: Setting) -> Measurement:
        """Put `setting` in place, run the workload once, return what it cost."""
        ...

    def apply(self, setting: Setting) -> None:
        """Leave `setting` in place (the tuner's choice)."""
        ...

    def reset(self) -> None:
        """Put every knob back to its default."""
        ...
