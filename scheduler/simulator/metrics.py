"""What a simulation measures: time integrals of GPU counts, start delays, counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernelfleet.scheduler.simulator.floor import saving_share


class Gauge:
    """A value that changes at instants; integrates value * time and keeps its history."""

    def __init__(self, start: float = 0.0, value: float = 0.0) -> None:
        self.value = value
        self.area = 0.0
        self._since = start
        self.history: list[tuple[float, float]] = [(start, value)]

    def set(self, now: float, value: float) -> None:
        if value == self.value:
            return
        self.area += self.value * (now - self._since)
        self._since = now
        self.value = value
        self.history.append((now, value))

    def close(self, now: float) -> None:
        """Account for the time up to `now` (call once, at the end)."""
        self.area += self.value * (now - self._since)
        self._since = now
        self.history.append((now, self.value))


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of an ascending list; 0 if empty."""
    if not sorted_values:
        return 0.0
    rank = (len(sorted_values) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass
class PolicyResult:
    """One policy's outcome. `as_json` gives exactly the documented JSON fields."""

    policy: str
    assumptions: dict[str, Any] = field(default_factory=dict)  # `policy_assumptions`
    sessions: int = 0
    events: int = 0
    migrations: int = 0  # every replica move: for a cell, or off a host being released
    migrations_for_cells: int = 0
    scale_outs: int = 0
    scale_ins: int = 0
    rejected_events: int = 0
    rejected_sessions: int = 0
    rejections: list[str] = field(default_factory=list)  # "line N: why", the first few
    end_s: float = 0.0
    gpu_hours_provisioned: float = 0.0
    gpu_hours_committed: float = 0.0
    gpu_hours_busy: float = 0.0
    peak_hosts: int = 0
    gpu_hours_floor: float = 0.0  # the trace's busy GPU-hours (`floor.busy_floor_gpu_hours`)
    gpu_hours_reservation: float | None = None  # the baseline of `saving_share`, if known
    reservation_source: str = ""  # where that baseline comes from, in words
    gpu_hours_spot: float = 0.0  # of `gpu_hours_provisioned`, on spot hosts
    dollars: float = 0.0  # provisioned GPU-hours at their kind's price
    dollars_on_demand: float = 0.0  # the same GPU-hours, all at the on-demand price
    revocations: int = 0  # spot hosts revoked
    replacements: int = 0  # replicas re-created elsewhere after their host was revoked
    replacements_failed: int = 0  # ... that found no host (the kernel runs on with fewer)
    kernels_lost: int = 0  # kernels left without a majority of live replicas by a revocation
    cells_interrupted: int = 0  # cells running on a revoked host, run again elsewhere
    gpu_hours_redone: float = 0.0  # the GPU-hours those cells had run before they were cut
    delays_s: list[float] = field(default_factory=list)
    provisioned_history: list[tuple[float, float]] = field(default_factory=list)
    busy_history: list[tuple[float, float]] = field(default_factory=list)
    committed_history: list[tuple[float, float]] = field(default_factory=list)

    def note_rejection(self, line: int, reason: str, detail: str = "") -> None:
        """Remember why the event on trace line `line` was refused (the first 20 are kept;
        ``rejected_events`` counts them all)."""
        if len(self.rejections) < 20:
            self.rejections.append(f"line {line}: {reason}" + (f" ({detail})" if detail else ""))

    def start_delay(self) -> dict[str, float]:
        ordered = sorted(self.delays_s)
        return {f"p{q}": round(percentile(ordered, q), 3) for q in (50, 95, 99)}

    @property
    def saving_share(self) -> float | None:
        """This policy's share of the possible saving (`floor.saving_share`); None when the
        reservation baseline is unknown or not above the floor."""
        if self.gpu_hours_reservation is None:
            return None
        return saving_share(
            self.gpu_hours_provisioned, self.gpu_hours_reservation, self.gpu_hours_floor
        )

    def as_json(self) -> dict[str, Any]:
        """The documented fields; those since the floor was added come after the first ones,
        and those of host kinds (docs/economics.md, "Transient hosts") last."""
        share = self.saving_share
        reservation = self.gpu_hours_reservation
        return {
            "gpu_hours_provisioned": round(self.gpu_hours_provisioned, 3),
            "gpu_hours_committed": round(self.gpu_hours_committed, 3),
            "start_delay_s": self.start_delay(),
            "migrations": self.migrations,
            "scale_outs": self.scale_outs,
            "scale_ins": self.scale_ins,
            "events": self.events,
            "gpu_hours_busy": round(self.gpu_hours_busy, 3),
            "gpu_hours_floor": round(self.gpu_hours_floor, 3),
            "gpu_hours_reservation": None if reservation is None else round(reservation, 3),
            "saving_share": None if share is None else round(share, 4),
            "dollars": round(self.dollars, 2),
            "dollars_on_demand": round(self.dollars_on_demand, 2),
            "gpu_hours_spot": round(self.gpu_hours_spot, 3),
            "revocations": self.revocations,
            "replacements": self.replacements,
            "replacements_failed": self.replacements_failed,
            "kernels_lost": self.kernels_lost,
            "cells_interrupted": self.cells_interrupted,
            "gpu_hours_redone": round(self.gpu_hours_redone, 3),
        }
