"""The trace-driven simulator: the built-in policies, unchanged, on a simulated fleet.

`simulate` runs one trace through several policies; `Simulation` is one run. The cluster model
and every assumption are in `SimulationConfig`.
"""

from __future__ import annotations

from collections.abc import Callable

from kernelfleet.scheduler.demand_model import DemandModel
from kernelfleet.scheduler.policies import ReservationPolicy
from kernelfleet.scheduler.policy import Policy
from kernelfleet.scheduler.simulator.config import EXPLANATIONS, SimulationConfig
from kernelfleet.scheduler.simulator.engine import Simulation
from kernelfleet.scheduler.simulator.floor import BASELINE, busy_floor_gpu_hours
from kernelfleet.scheduler.simulator.metrics import PolicyResult
from kernelfleet.scheduler.trace import Trace

__all__ = ["EXPLANATIONS", "PolicyResult", "Simulation", "SimulationConfig", "simulate"]


def simulate(
    trace: Trace,
    policies: list[Policy],
    config: SimulationConfig,
    progress: Callable[[str, float], None] | None = None,
    *,
    reference: bool = False,
    demand_model: DemandModel | None = None,
) -> dict[str, PolicyResult]:
    """Run `trace` through each policy in turn; results by policy name, in the given order.

    Each result carries the trace's GPU-hour floor and, when ``reservation`` is among the
    policies, its provisioned GPU-hours as the baseline of the saving share. With `reference`,
    a run without ``reservation`` simulates it as well for that baseline (not in the results).
    With a `demand_model`, every autoscaling policy (the reference too) scales on its
    predictions (`Simulation`).
    """
    results: dict[str, PolicyResult] = {}
    for policy in policies:

        def report(fraction: float, name: str = policy.name) -> None:
            if progress is not None:
                progress(name, fraction)

        results[policy.name] = Simulation(policy, trace, config, report, demand_model).run()
    baseline, source = results.get(BASELINE), f"the {BASELINE} run"
    if baseline is None and reference:
        reference_policy = ReservationPolicy(config.autoscaling())
        baseline = Simulation(reference_policy, trace, config, None, demand_model).run()
        source = f"a {BASELINE} run added as the reference (not listed)"
    floor = busy_floor_gpu_hours(trace, config.gpus_per_host)
    for result in results.values():
        result.gpu_hours_floor = floor
        if baseline is not None:
            result.gpu_hours_reservation = baseline.gpu_hours_provisioned
            result.reservation_source = source
    return results
