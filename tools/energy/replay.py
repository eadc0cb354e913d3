"""`ReplayBackend`: the tuner over Zeus's measured power tables, so it runs without a GPU.

Zeus (NSDI'23) published, per GPU model, one epoch of training measured for six workloads at
every (batch size, power limit) pair: ``summary_power_<gpu>.csv`` with the columns ``dataset,
network, batch_size, optimizer, power_limit, time_per_epoch, average_power``. One *table* is
one GPU x (dataset, network, optimizer); its knobs are ``power_limit`` (W) and ``batch``.

What a setting costs here: latency is the table's ``time_per_epoch`` (s) and energy
``time_per_epoch x average_power`` (J per epoch). Per-sample figures would divide both by the
dataset's size, the same constant for every setting of a table, so they would rank the
settings identically; the tables do not carry that size, so the figures stay per epoch. An
SLO on this backend is therefore a bound on the time of an epoch (a throughput floor).

The default (untuned) setting is the maximum of each knob: the highest power limit (what a GPU
runs at unless told otherwise) and the largest batch of the table.

The tables are read where they lie and never copied: a folder given explicitly, else
``$KERNELFLEET_ZEUS_TRACE``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.tools.energy.backend import Measurement
from kernelfleet.tools.energy.errors import SettingUnavailable, TraceNotFound
from kernelfleet.tools.energy.knobs import (
    BATCH,
    POWER_LIMIT,
    Knob,
    SearchSpace,
    Setting,
    describe,
    select,
)

TRACE_VARIABLE = "KERNELFLEET_ZEUS_TRACE"
"""The folder of ``summary_power_<gpu>.csv`` files when none is given."""

TABLE_PREFIX = "summary_power_"


@dataclass(frozen=True)
class Workload:
    """One table: a GPU model and a (dataset, network, optimizer) trained on it."""

    gpu: str
    dataset: str
    network: str
    optimizer: str

    def __str__(self) -> str:
        return f"{self.gpu}:{self.dataset}/{self.network}/{self.optimizer}"


def trace_folder(folder: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the power tables: `folder`, else ``$KERNELFLEET_ZEUS_TRACE``. Raises
    `TraceNotFound` when neither names a folder holding ``summary_power_*.csv``."""
    if folder is None:
        folder = os.environ.get(TRACE_VARIABLE)
        if not folder:
            raise TraceNotFound(
                f"no Zeus trace folder: pass one, or set {TRACE_VARIABLE} to the folder of "
                f"{TABLE_PREFIX}<gpu>.csv (Zeus's trace/ folder)"
            )
    path = Path(folder).expanduser()
    if not any(path.glob(f"{TABLE_PREFIX}*.csv")):
        raise TraceNotFound(f"no {TABLE_PREFIX}<gpu>.csv in {path}")
    return path


def workloads(folder: str | os.PathLike[str] | None = None) -> list[Workload]:
    """Every table of every GPU in the trace folder, sorted."""
    found: set[Workload] = set()
    for path in sorted(trace_folder(folder).glob(f"{TABLE_PREFIX}*.csv")):
        gpu = path.stem.removeprefix(TABLE_PREFIX)
        for row in _rows(path):
            found.add(Workload(gpu, row["dataset"], row["network"], row["optimizer"]))
    return sorted(found, key=str)


def find_workload(spec: str, folder: str | os.PathLike[str] | None = None) -> Workload:
    """The table `spec` names: ``GPU:DATASET/NETWORK`` or ``GPU:DATASET/NETWORK/OPTIMIZER``
    (the optimizer may be left out when the GPU has one table for that pair). Raises
    `TraceNotFound` naming the tables there are when it names none, or several."""
    gpu, _, rest = spec.partition(":")
    parts = rest.split("/")
    if not gpu or len(parts) not in (2, 3) or not all(parts):
        raise TraceNotFound(f"{spec!r} is not GPU:DATASET/NETWORK[/OPTIMIZER]")
    every = workloads(folder)
    matches = [
        w
        for w in every
        if (w.gpu, w.dataset, w.network) == (gpu, parts[0], parts[1])
        and (len(parts) == 2 or w.optimizer == parts[2])
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise TraceNotFound(f"{spec} is ambiguous: {', '.join(map(str, matches))}")
    of_gpu = [str(w) for w in every if w.gpu == gpu]
    known = ", ".join(of_gpu) if of_gpu else "GPUs " + ", ".join(sorted({w.gpu for w in every}))
    raise TraceNotFound(f"no table {spec} in the trace: there are {known}")


class ReplayBackend:
    """The `EnergyBackend` over one Zeus table: `measure` looks the setting up."""

    deterministic = True

    def __init__(self, workload: Workload, folder: str | os.PathLike[str] | None = None) -> None:
        self.workload = workload
        self.name = f"the replay of {workload}"
        path = trace_folder(folder) / f"{TABLE_PREFIX}{workload.gpu}.csv"
        self._table: dict[tuple[float, float], tuple[float, float]] = {}
        for row in _rows(path):
            if (row["dataset"], row["network"], row["optimizer"]) != (
                workload.dataset,
                workload.network,
                workload.optimizer,
            ):
                continue
            key = (float(row["power_limit"]), float(row["batch_size"]))
            self._table[key] = (float(row["time_per_epoch"]), float(row["average_power"]))
        if not self._table:
            raise TraceNotFound(f"no rows for {workload} in {path}")
        self.applied: dict[str, float] | None = None
        """What `apply` left in place (None: the defaults)."""

    @classmethod
    def from_spec(cls, spec: str, folder: str | os.PathLike[str] | None = None) -> ReplayBackend:
        """The backend of the table `spec` names (see `find_workload`)."""
        return cls(find_workload(spec, folder), folder)

    def offered(self) -> list[Knob]:
        """``power_limit`` and ``batch``: the values the table holds, defaults at the top."""
        limits = tuple(sorted({pl for pl, _ in self._table}))
        batches = tuple(sorted({bs for _, bs in self._table}))
        return [Knob(POWER_LIMIT, limits, limits[-1]), Knob(BATCH, batches, batches[-1])]

    def space(self, knobs: Sequence[str] | None = None) -> SearchSpace:
        """The space over the `knobs` named; a knob left out stays at its default."""
        return select(self.offered(), knobs, self.name)

    def measure(self, setting: Setting) -> Measurement:
        """The table's epoch time and energy at `setting` (knobs it leaves out at their
        default). A pair the table lacks (Zeus did not measure it: a batch that did not fit,
        say) raises `SettingUnavailable`."""
        full = {knob.name: knob.default for knob in self.offered()} | dict(setting)
        key = (full[POWER_LIMIT], full[BATCH])
        if key not in self._table:
            raise SettingUnavailable(f"{self.workload} has no row for {describe(full)}")
        seconds, watts = self._table[key]
        return Measurement(latency_s=seconds, energy_j=seconds * watts)

    def covers(self, setting: Setting) -> bool:
        """Whether the table measured `setting`."""
        full = {knob.name: knob.default for knob in self.offered()} | dict(setting)
        return (full[POWER_LIMIT], full[BATCH]) in self._table

    def apply(self, setting: Setting) -> None:
        self.applied = dict(setting)

    def reset(self) -> None:
        self.applied = None


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
