"""What the gateway's own counters (``GET /metrics``) say its autoscaler did during a replay.

The replay reads the counters before its first kernel and after its last session, and reports
the difference: hosts the autoscaler started and stopped, and how long a host took to start
(until its agent listened) and a replica took to move, in wall seconds. Those two are what the
simulator takes as ``scale_out_delay_s`` and ``migration_cost_s`` (times the time scale).
Polling ``GET /api/fleet/hosts`` (`FleetMeter`) counts scale-outs too, but misses a host alive
for less than a poll interval; the counters miss nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SCALE_OUTS = "kernelfleet_scale_out_hosts_total"
SCALE_INS = "kernelfleet_scale_in_hosts_total"
HOST_START = "kernelfleet_scale_out_seconds"
MIGRATION = "kernelfleet_migration_seconds"
MIGRATIONS_SUCCEEDED = 'kernelfleet_migrations_total{outcome="succeeded"}'


@dataclass(frozen=True)
class AutoscalerCounts:
    """The autoscaler's work between two readings of ``/metrics``; a mean is None when nothing
    was timed."""

    scale_outs: int
    scale_ins: int
    host_start_wall_s: float | None
    migrations: int
    migration_wall_s: float | None

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> AutoscalerCounts:
        def grew(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        def mean(histogram: str) -> float | None:
            count = grew(f"{histogram}_count")
            return round(grew(f"{histogram}_sum") / count, 4) if count > 0 else None

        return cls(
            scale_outs=round(grew(SCALE_OUTS)),
            scale_ins=round(grew(SCALE_INS)),
            host_start_wall_s=mean(HOST_START),
            migrations=round(grew(MIGRATIONS_SUCCEEDED)),
            migration_wall_s=mean(MIGRATION),
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
