"""Host kinds: on-demand hosts and revocable (spot) ones, their prices, and the placement rule
that makes a revocation cost a replica replacement, never a kernel (docs/economics.md,
"Transient hosts").

- `SpotMarket`: the price of a GPU-hour of each kind and the revocation process of a spot host
  (a Poisson process of ``revocation_rate_per_hour`` per spot host-hour, each revocation told
  ``notice_s`` ahead), validated: negative, NaN and absurd values are refused with the field
  named.
- The placement rule: a kernel of ``r`` replicas keeps a Raft majority on on-demand hosts, so at
  most ``(r - 1) // 2`` of its replicas sit on spot hosts (one of 3; none of 1). A policy may
  loosen it (`Policy.max_spot_replicas`) only to show what that costs.
- `kind_to_add`: which kind the autoscaler adds, keeping spot hosts at most ``spot_share`` of
  the fleet.

Pure: the simulator and the gateway call the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.snapshot import FleetSnapshot, HostSnapshot

ON_DEMAND = "on-demand"
SPOT = "spot"
HOST_KINDS = (ON_DEMAND, SPOT)

# Defaults, with their sources (docs/economics.md, "Transient hosts"):
V100_ON_DEMAND_PRICE = 2.48
"""$/GPU-hour of an on-demand V100 on Google Cloud (us-central1 list price of 2019-2020, the
platform and period of the CM-DARE measurements)."""
V100_PREEMPTIBLE_PRICE = 0.74
"""$/GPU-hour of a preemptible V100 on Google Cloud, same list and period."""
PREEMPTIBLE_RATE_PER_HOUR = 1 / 24
"""Revocations per spot host-hour: Google Cloud stops every preemptible VM within 24 hours, so
its mean lifetime is at most 24 h; the memoryless rate with that mean, the fewest revocations
consistent with it (a simplification:
Kadupitiya et al., 2019, measured a bathtub-shaped hazard, not a constant one)."""
PREEMPTIBLE_NOTICE_S = 30.0
"""Google Cloud's preemption notice: an ACPI soft-off 30 s before the VM stops."""
PREEMPTIBLE_EXTRA_START_S = 16.0
"""How much longer a preemptible GPU VM takes to be ready than an on-demand one: CM-DARE's
startup-time measurements (provisioning + staging + booting, K80 and P100, two regions) average
86.9 s for preemptible VMs (45 starts) against 71.0 s on demand (55 starts)."""

MAX_PRICE = 1000.0
"""$/GPU-hour above which a price is taken for a typo (a GPU-hour costs dollars, not
thousands)."""
MAX_RATE_PER_HOUR = 60.0
"""Revocations per host-hour above which the rate is refused: a spot host would then live under
a minute on average, less than it takes to boot."""
MAX_NOTICE_S = 24 * 3600.0


@dataclass(frozen=True)
class SpotMarket:
    """Prices and the revocation process. ``spot_share`` is the most of the fleet's hosts the
    autoscaler keeps as spot (0: an on-demand-only fleet, the default); ``spot_extra_start_s``
    is added to a spot host's start time. Every field is checked (`InvalidRequest` naming it):
    no negative or NaN value, prices up to `MAX_PRICE`, a spot price not above the on-demand one,
    rates up to `MAX_RATE_PER_HOUR`, a notice up to a day, a share up to 1."""

    on_demand_price: float = V100_ON_DEMAND_PRICE
    spot_price: float = V100_PREEMPTIBLE_PRICE
    revocation_rate_per_hour: float = PREEMPTIBLE_RATE_PER_HOUR
    notice_s: float = PREEMPTIBLE_NOTICE_S
    spot_extra_start_s: float = PREEMPTIBLE_EXTRA_START_S
    spot_share: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(f"host kind parameter {name} must be a number, not {value!r}")
            if not value >= 0 or math.isinf(value):  # `not >=` also refuses NaN
                raise InvalidRequest(f"host kind parameter {name} must be >= 0, not {value}")
        for name in ("on_demand_price", "spot_price"):
            if getattr(self, name) > MAX_PRICE:
                raise InvalidRequest(
                    f"host kind parameter {name} is {getattr(self, name)} $/GPU-hour: above "
                    f"{MAX_PRICE:g}, which no GPU costs"
                )
        if self.spot_price > self.on_demand_price:
            raise InvalidRequest(
                f"host kind parameter spot_price ({self.spot_price}) is above on_demand_price "
                f"({self.on_demand_price}): a revocable host must cost less"
            )
        if self.revocation_rate_per_hour > MAX_RATE_PER_HOUR:
            raise InvalidRequest(
                f"host kind parameter revocation_rate_per_hour is {self.revocation_rate_per_hour}"
                f": above {MAX_RATE_PER_HOUR:g}, a spot host would not live long enough to boot"
            )
        if self.notice_s > MAX_NOTICE_S:
            raise InvalidRequest(
                f"host kind parameter notice_s is {self.notice_s}: above a day ({MAX_NOTICE_S:g})"
            )
        if self.spot_share > 1:
            raise InvalidRequest(
                f"host kind parameter spot_share is {self.spot_share}: a share is at most 1"
            )

    @property
    def assumptions(self) -> dict[str, Any]:
        return asdict(self)

    def price(self, kind: str) -> float:
        """$/GPU-hour of a host of `kind`."""
        return self.spot_price if check_kind(kind) == SPOT else self.on_demand_price


def check_kind(kind: Any, field: str = "kind") -> str:
    """`kind` if it is a host kind; `InvalidRequest` naming `field` and the kinds otherwise."""
    if kind not in HOST_KINDS:
        raise InvalidRequest(f"{field} must be one of {', '.join(HOST_KINDS)}, not {kind!r}")
    return str(kind)


def spot_replicas_allowed(replicas: int, override: int | None = None) -> int:
    """How many of a kernel's `replicas` may sit on spot hosts: fewer than a majority,
    ``(replicas - 1) // 2`` (one of 3, none of 1); `override`, when given, instead, but never
    all of them (a single replica never goes on spot)."""
    if override is not None:
        return max(0, min(override, replicas - 1))
    return max(0, (replicas - 1) // 2)


def choose_within_spot_limit(
    ordered: Iterable[HostSnapshot], replicas: int, spot_allowed: int
) -> list[HostSnapshot]:
    """The first `replicas` hosts of `ordered` (a policy's preference order), passing over spot
    hosts once `spot_allowed` are taken; fewer when the order runs out."""
    chosen: list[HostSnapshot] = []
    spot = 0
    for host in ordered:
        if len(chosen) == replicas:
            break
        if host.kind == SPOT:
            if spot >= spot_allowed:
                continue
            spot += 1
        chosen.append(host)
    return chosen


def spot_hosts_barred(
    snapshot: FleetSnapshot,
    replica_hosts: Sequence[str],
    leaving: str | None,
    spot_allowed: int,
    catching_up: Sequence[str] = (),
    wanted: int = 0,
) -> set[str]:
    """The spot hosts a replica of a kernel whose replicas are on `replica_hosts` may not move
    or be added to: all of them when the kernel's replicas that stay (all but `leaving`, the one
    moving or lost, if any) already use its `spot_allowed` places off the safe majority; none
    otherwise. A replica still `catching_up` takes such a place wherever it is: until it is a
    live member it is no part of the majority that a revocation must leave (listed among
    `replica_hosts` or not); so does each replica missing from the `wanted` ones (lost, with
    no replacement yet)."""
    staying = [host_id for host_id in replica_hosts if host_id != leaving]
    unsafe = {host_id for host_id in staying if kind_of(snapshot, host_id) == SPOT}
    unsafe.update(host_id for host_id in catching_up if host_id != leaving)
    missing = max(0, wanted - len({*replica_hosts, *catching_up}))
    if len(unsafe) + missing < spot_allowed:
        return set()
    return {host.id for host in snapshot.hosts if host.kind == SPOT}


def kind_of(snapshot: FleetSnapshot, host_id: str) -> str:
    """The kind of host `host_id`; on-demand for a host the snapshot does not know."""
    host = snapshot.host(host_id)
    return host.kind if host is not None else ON_DEMAND


def kind_to_add(spot_hosts: int, all_hosts: int, spot_share: float) -> str:
    """The kind of the next host added to a fleet of `all_hosts` (alive and being added), of
    which `spot_hosts` are spot: spot while that keeps spot hosts within `spot_share` of the
    fleet, on-demand otherwise."""
    if spot_share > 0 and spot_hosts + 1 <= spot_share * (all_hosts + 1) + 1e-9:
        return SPOT
    return ON_DEMAND
