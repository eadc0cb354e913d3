"""``%energy``: the energy a cell uses per GPU, and PolyThrottle's tuner of GPU settings.

- `tune` (`kernelfleet.tools.energy.tuner`): constrained Bayesian optimisation of energy under
  a latency SLO over the knobs of an `EnergyBackend`;
- `ReplayBackend` (`replay`): Zeus's measured power tables, no GPU needed;
- `FleetBackend` (`fleet`): the GPUs bound to the running cell, set through the gateway and
  measured with NVML (`meter`);
- the magics (`magics`): ``%energy measure``, ``%%energy tune``, ``%energy reset``.

docs/energy.md tells the whole story. Importing this package is cheap: optuna and pynvml are
imported when first used.
"""

from kernelfleet.tools.energy.backend import EnergyBackend, GpuEnergy, Measurement
from kernelfleet.tools.energy.errors import (
    EnergyError,
    NoGpuBound,
    SettingRefused,
    TraceNotFound,
    UnknownKnob,
)
from kernelfleet.tools.energy.knobs import KNOB_NAMES, Knob, SearchSpace
from kernelfleet.tools.energy.replay import ReplayBackend
from kernelfleet.tools.energy.tuner import Trial, TuneResult, tune

__all__ = [
    "KNOB_NAMES",
    "EnergyBackend",
    "EnergyError",
    "GpuEnergy",
    "Knob",
    "Measurement",
    "NoGpuBound",
    "ReplayBackend",
    "SearchSpace",
    "SettingRefused",
    "TraceNotFound",
    "Trial",
    "TuneResult",
    "UnknownKnob",
    "tune",
]
