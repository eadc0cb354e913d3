"""The trace-driven simulator: the built-in policies, unchanged, on a simulated fleet.

`simulate` runs one trace through several policies; `Simulation` is one run. The cluster model
and every assumption are in `SimulationConfig`.
"""

from __future__ import annotations

from collections.abc import Callable

from kernelfleet.scheduler.policy import Policy
from kernelfleet.scheduler.simulator.config import EXPLANATIONS, SimulationConfig
from kernelfleet.scheduler.simulator.engine import Simulation
from kernelfleet.scheduler.simulator.metrics import PolicyResult
from kernelfleet.scheduler.trace import Trace

__all__ = ["EXPLANATIONS", "PolicyResult", "Simulation", "SimulationConfig", "simulate"]


def simulate(
    trace: Trace,
    policies: list[Policy],
    config: SimulationConfig,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, PolicyResult]:
    """Run `trace` through each policy in turn; results by policy name, in the given order."""
    results: dict[str, PolicyResult] = {}
    for policy in policies:

        def report(fraction: float, name: str = policy.name) -> None:
            if progress is not None:
                progress(name, fraction)

        results[policy.name] = Simulation(policy, trace, config, report).run()
    return results
