"""Turning results into the printed table, the JSON document and the policy objects by name."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.policies import AutoscalingPolicy
from kernelfleet.scheduler.policy import ENTRY_POINT_GROUP, Policy
from kernelfleet.scheduler.registry import SHIPPED_POLICIES
from kernelfleet.scheduler.simulator.config import (
    EXPLANATIONS,
    SimulationConfig,
    policy_assumptions,
)
from kernelfleet.scheduler.simulator.metrics import PolicyResult


def resolve_policy(name: str, autoscaling: AutoscaleConfig) -> Policy:
    """The policy registered as `name` (entry points first, then this package's own,
    `SHIPPED_POLICIES`), given the simulation's autoscaler parameters when it takes them;
    `InvalidRequest` lists the names."""
    classes: dict[str, Any] = dict(SHIPPED_POLICIES)
    classes.update((ep.name, ep) for ep in entry_points(group=ENTRY_POINT_GROUP))
    if name not in classes:
        raise InvalidRequest(
            f"unknown policy {name!r}; known policies: {', '.join(sorted(classes))}"
        )
    found = classes[name]
    policy_class = found if isinstance(found, type) else found.load()
    if issubclass(policy_class, AutoscalingPolicy):
        return policy_class(autoscaling)
    policy: Policy = policy_class()
    return policy


def as_document(config: SimulationConfig, results: dict[str, PolicyResult]) -> dict[str, Any]:
    """Exactly ``{"assumptions": {...}, "policies": {NAME: {...}}}`` (`PolicyResult.as_json`);
    the assumptions are the config's and, under ``per_policy``, each policy's own."""
    per_policy = {name: result.assumptions for name, result in results.items()}
    return {
        "assumptions": {**config.assumptions, "per_policy": per_policy},
        "policies": {name: result.as_json() for name, result in results.items()},
    }


def assumptions_text(config: SimulationConfig, policies: list[Policy] | None = None) -> str:
    """The config's assumptions, one a line, then each policy's (`policy_assumptions`)."""
    lines = ["Assumptions (change any with --SimulateApp.<name>=VALUE):"]
    for name, value in config.assumptions.items():
        lines.append(f"  {name:<24} {value!s:<8} {EXPLANATIONS[name]}")
    for policy in policies or []:
        lines.append(f"  {policy.name + ':':<24} {policy_assumptions_text(policy)}")
    return "\n".join(lines)


def policy_assumptions_text(policy: Policy) -> str:
    """One line: ``3 replicas, GPUs per-cell, state sync off-critical-path; autoscaler ...``."""
    found = policy_assumptions(policy)
    text = (
        f"{found['replicas']} replica(s), GPUs bound {found['gpu_binding']}, "
        f"state sync {found['state_sync']}; "
    )
    scaling = found["autoscaling"]
    if scaling is None:
        return text + "its own autoscaler"
    return text + (
        f"autoscaler headroom {scaling['headroom']:g}, buffer {scaling['buffer_hosts']} "
        f"host(s), {scaling['min_hosts']}-{scaling['max_hosts'] or 'any'} hosts, "
        f"at most {scaling['max_scale_in']} released a round, "
        f"{'counting' if scaling['count_waiting'] else 'not counting'} queued GPUs"
        + _steadiness_text(scaling)
    )


def _steadiness_text(scaling: dict[str, Any]) -> str:
    """The anti-flapping knobs that are on, as a clause; "" with all off (NotebookOS's rule)."""
    parts = []
    if scaling["scale_in_headroom"]:
        parts.append(f"scale-in only above headroom {scaling['scale_in_headroom']:g}")
    if scaling["scale_in_idle_s"]:
        parts.append(f"a host released after {scaling['scale_in_idle_s']:g} s idle")
    if scaling["min_host_lifetime_s"]:
        parts.append(f"and {scaling['min_host_lifetime_s']:g} s up")
    if scaling["warm_quantile"]:
        parts.append(
            f"warm GPUs for arrivals within {scaling['warm_lead_s']:g} s "
            f"at the {scaling['warm_quantile']:g} quantile"
        )
    return "; " + ", ".join(parts) if parts else ""


COLUMNS = (
    ("policy", "{}"),
    ("GPU-h prov", "{:,.0f}"),
    ("GPU-h commit", "{:,.0f}"),
    ("GPU-h busy", "{:,.0f}"),
    ("saving %", "{}"),
    ("dollars", "{:,.0f}"),
    ("delay p50 s", "{:.1f}"),
    ("p95 s", "{:.1f}"),
    ("p99 s", "{:.1f}"),
    ("migrations", "{:,}"),
    ("(for cells)", "{:,}"),
    ("scale-outs", "{:,}"),
    ("scale-ins", "{:,}"),
    ("peak hosts", "{:,}"),
    ("sessions", "{:,}"),
    ("events", "{:,}"),
    ("rejected", "{:,}"),
    ("revoked", "{:,}"),
    ("kernels lost", "{:,}"),
)


def floor_text(results: dict[str, PolicyResult]) -> str:
    """The floor, and what the saving share ("saving %" in the table) is measured against."""
    first = next(iter(results.values()), None)
    if first is None:
        return ""
    text = (
        f"Floor: {first.gpu_hours_floor:,.0f} busy GPU-hours (what the cells hold; no policy "
        "provisions less). "
    )
    if first.gpu_hours_reservation is None:
        return text + "No reservation figure: no saving share."
    return text + (
        "saving % = (reservation - policy) / (reservation - floor) in provisioned GPU-hours, "
        f"against {first.gpu_hours_reservation:,.0f} from {first.reservation_source}."
    )


def results_table(results: dict[str, PolicyResult]) -> str:
    """A plain-text table, one row per policy; "saving %" is "-" where there is no share."""
    rows = [[title for title, _ in COLUMNS]]
    for name, r in results.items():
        delay = r.start_delay()
        values = (
            name,
            r.gpu_hours_provisioned,
            r.gpu_hours_committed,
            r.gpu_hours_busy,
            "-" if r.saving_share is None else f"{100 * r.saving_share:.0f}",
            r.dollars,
            delay["p50"],
            delay["p95"],
            delay["p99"],
            r.migrations,
            r.migrations_for_cells,
            r.scale_outs,
            r.scale_ins,
            r.peak_hosts,
            r.sessions,
            r.events,
            r.rejected_events,
            r.revocations,
            r.kernels_lost,
        )
        rows.append([fmt.format(v) for (_, fmt), v in zip(COLUMNS, values, strict=True)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)
