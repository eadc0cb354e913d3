"""Every assumption of the simulation, named, with its default and meaning.

All durations are in seconds of simulated time. `SimulationConfig.assumptions` is what the
command prints and writes under ``"assumptions"`` in its JSON; `policy_assumptions` is what
each policy adds (written under ``"assumptions"["per_policy"]``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.autoscale import AutoscaleConfig
from kernelfleet.scheduler.hostkinds import SpotMarket
from kernelfleet.scheduler.policies import AutoscalingPolicy
from kernelfleet.scheduler.policy import Policy

#: one line per assumption, printed with the results
EXPLANATIONS = {
    "hosts": "hosts alive at the start, and the fewest the autoscaler keeps",
    "gpus_per_host": "GPUs on every host, including those added by scale-out",
    "max_hosts": "most hosts the autoscaler may have (0: no limit)",
    "scale_out_delay_s": "time from a scale-out decision until the new host is usable",
    "autoscale_interval_s": "time between autoscaling rounds",
    "autoscale_headroom": "committed GPUs are multiplied by this in the scale-out target",
    "autoscale_buffer_hosts": "hosts added to the scale-out target",
    "max_scale_in": "most fully idle hosts released per autoscaling round",
    "count_waiting_gpus": "queued requests' GPUs count as committed in the target",
    "scale_in_headroom": "scale in only above the target under this headroom (0: the same as "
    "autoscale_headroom; docs/economics.md)",
    "scale_in_idle_s": "a host is released only after this long with no committed GPU",
    "min_host_lifetime_s": "a host is released only after this long up",
    "warm_quantile": "keep idle the GPUs that cells arriving within warm_lead_s need at this "
    "quantile (0: no warm capacity)",
    "warm_lead_s": "the lead time the warm capacity covers (0: scale_out_delay_s + "
    "autoscale_interval_s)",
    "arrival_window_s": "moving window of the cell arrival rate behind the warm capacity",
    "migration_cost_s": "a replica migration's delay on the migrating cell's critical path",
    "container_start_s": "fcfs-batch: starting a fresh container for a cell",
    "state_load_s": "fcfs-batch: loading the kernel's state before a cell (GPUs held)",
    "state_save_s": "fcfs-batch: saving the kernel's state after a cell (GPUs held)",
    "session_lead_s": "a session's kernel starts this long before its first event",
    "session_linger_s": "a session ends this long after its last event (idle reclamation)",
    "idle_timeout_s": "a kernel idle this long between cells is reclaimed, and re-created "
    "session_lead_s before its next cell (0: never; Sensei reclaims after 30 min)",
    "ratio_window_s": "moving window of the demand/busy subscription ratio",
    "on_demand_price": "$ per GPU-hour of an on-demand host (docs/economics.md, Transient hosts)",
    "spot_price": "$ per GPU-hour of a spot (revocable) host",
    "spot_share": "most of the fleet's hosts that scale-out adds as spot (0: on-demand only)",
    "revocation_rate_per_hour": "revocations per spot host-hour (a Poisson process)",
    "notice_s": "a revocation is told this long before the spot host goes",
    "spot_extra_start_s": "a spot host takes this much longer to start than scale_out_delay_s",
    "spot_replicas_max": "most replicas of a kernel on spot hosts (-1: fewer than a majority, "
    "the safe rule; more only to measure what breaking it costs)",
    "revocation_seed": "seed of the revocation times (the same seed, the same revocations)",
}

#: the fields of `SpotMarket` among the simulation's, in its order
MARKET_FIELDS = tuple(SpotMarket.__dataclass_fields__)


@dataclass(frozen=True)
class SimulationConfig:
    """The cluster model and session model; see `EXPLANATIONS` for each field."""

    hosts: int = 3
    gpus_per_host: int = 8
    max_hosts: int = 0
    scale_out_delay_s: float = 60.0
    autoscale_interval_s: float = 30.0
    autoscale_headroom: float = 1.05
    autoscale_buffer_hosts: int = 1
    max_scale_in: int = 2
    count_waiting_gpus: bool = True
    scale_in_headroom: float = 0.0
    scale_in_idle_s: float = 0.0
    min_host_lifetime_s: float = 0.0
    warm_quantile: float = 0.0
    warm_lead_s: float = 0.0
    arrival_window_s: float = 900.0
    migration_cost_s: float = 10.0
    container_start_s: float = 5.0
    state_load_s: float = 10.0
    state_save_s: float = 10.0
    session_lead_s: float = 60.0
    session_linger_s: float = 1800.0
    idle_timeout_s: float = 1800.0
    ratio_window_s: float = 300.0
    on_demand_price: float = SpotMarket.on_demand_price
    spot_price: float = SpotMarket.spot_price
    spot_share: float = SpotMarket.spot_share
    revocation_rate_per_hour: float = SpotMarket.revocation_rate_per_hour
    notice_s: float = SpotMarket.notice_s
    spot_extra_start_s: float = SpotMarket.spot_extra_start_s
    spot_replicas_max: int = -1
    revocation_seed: int = 0

    def __post_init__(self) -> None:
        self.market()  # refuses impossible prices and rates, naming the field
        for name, value in asdict(self).items():
            if name == "spot_replicas_max":
                continue
            if not isinstance(value, bool) and not value >= 0:  # also refuses NaN
                raise InvalidRequest(f"simulation parameter {name} must be >= 0, not {value}")
        if self.spot_replicas_max < -1:
            raise InvalidRequest(
                "simulation parameter spot_replicas_max must be -1 (the majority rule) or >= 0, "
                f"not {self.spot_replicas_max}"
            )
        if self.gpus_per_host < 1:
            raise InvalidRequest("simulation parameter gpus_per_host must be >= 1")
        if self.autoscale_interval_s <= 0:
            raise InvalidRequest("simulation parameter autoscale_interval_s must be > 0")
        if self.arrival_window_s <= 0:
            raise InvalidRequest("simulation parameter arrival_window_s must be > 0")
        if self.max_hosts and self.max_hosts < self.hosts:
            raise InvalidRequest(f"max_hosts {self.max_hosts} is below hosts {self.hosts}")

    @property
    def assumptions(self) -> dict[str, Any]:
        return asdict(self)

    def market(self) -> SpotMarket:
        """The host kinds' prices and revocation process (`InvalidRequest` naming a bad one)."""
        return SpotMarket(**{name: getattr(self, name) for name in MARKET_FIELDS})

    @property
    def spot_replicas_override(self) -> int | None:
        """`Policy.max_spot_replicas` for the simulated policies: None under the majority rule."""
        return None if self.spot_replicas_max < 0 else self.spot_replicas_max

    def autoscaling(self) -> AutoscaleConfig:
        """The policies' autoscaler parameters implied by this model."""
        return AutoscaleConfig(
            headroom=self.autoscale_headroom,
            buffer_hosts=self.autoscale_buffer_hosts,
            max_scale_in=self.max_scale_in,
            min_hosts=self.hosts,
            max_hosts=self.max_hosts,
            count_waiting=self.count_waiting_gpus,
            scale_in_headroom=self.scale_in_headroom,
            scale_in_idle_s=self.scale_in_idle_s,
            min_host_lifetime_s=self.min_host_lifetime_s,
            warm_quantile=self.warm_quantile,
            warm_lead_s=self.warm_lead_s or self.scale_out_delay_s + self.autoscale_interval_s,
        )


def policy_assumptions(policy: Policy) -> dict[str, Any]:
    """What a policy brings to the model besides `SimulationConfig`: replicas per kernel, when
    it binds GPUs, where its state sync sits, and the autoscaler parameters it actually uses
    (read from the policy, so a policy that changes the config's would show it; None for a
    policy with an autoscaler of its own)."""
    autoscaling = policy.autoscaling if isinstance(policy, AutoscalingPolicy) else None
    return {
        "replicas": policy.replicas,
        "gpu_binding": policy.binding.value,
        "state_sync": policy.state_sync.value,
        "autoscaling": asdict(autoscaling) if autoscaling is not None else None,
    }
