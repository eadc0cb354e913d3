"""From a round's plan to concrete devices: which host's GPUs each planned job runs on. Pure.

A `RoundPlan` says "job j runs on n GPUs of type t next round"; the live gateway must name the
host and its device ids. `place` does, with three rules:

- a job's GPUs are all on one host (a multi-GPU job's processes share a machine);
- a job that runs already keeps its devices when its lease is the same type and size and those
  devices are still there for jobs (no stop and restart for nothing: Gavel's lease extension);
- the others go, largest first, to the host of their type with the fewest free devices that
  still fit them (best fit, so a later large job finds a whole host; among equal fits, the host
  whose lease would be fastest), on the fastest free devices there (lowest device ids first
  among equals).

Devices of one type differ in speed (`HostDevices.speeds`, relative to a typical GPU of the
type: `kernelfleet.gateway.gpu_speeds`). A lease runs at the speed of its slowest GPU
(`lease_speed`): its throughput is the type's times that.

A planned job that fits nowhere (the devices of its type are scattered over hosts, say) waits
this round: it is absent from the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kernelfleet.scheduler.jobs.model import RoundPlan


@dataclass(frozen=True)
class HostDevices:
    """The devices of one host that jobs may use this round (no cell holds them), in order;
    ``speeds``: each device's relative speed, in the same order (empty: 1.0 for all)."""

    host: str
    gpu_type: str
    devices: tuple[str, ...]
    speeds: tuple[float, ...] = ()

    def speed_of(self) -> dict[str, float]:
        """Device -> relative speed."""
        return dict(zip(self.devices, self.speeds or (1.0,) * len(self.devices), strict=True))


@dataclass(frozen=True)
class Placement:
    """One job's devices for the round."""

    host: str
    gpu_type: str
    devices: tuple[str, ...]


def lease_speed(devices: Sequence[str], speeds: Mapping[str, float]) -> float:
    """How fast a lease on `devices` runs, relative to the type's typical GPU: its slowest
    device's speed (`speeds`; a device missing there is 1.0)."""
    return min((speeds.get(device, 1.0) for device in devices), default=1.0)


def place(
    plan: RoundPlan, hosts: Sequence[HostDevices], current: Mapping[str, Placement]
) -> dict[str, Placement]:
    """Where each job of `plan` runs; `current` is where running jobs run now."""
    speeds = {host.host: host.speed_of() for host in hosts}
    free = {host.host: _fastest_first(host) for host in hosts}
    types = {host.host: host.gpu_type for host in hosts}
    placed: dict[str, Placement] = {}
    for job_id in sorted(plan.leases):
        lease, now = plan.leases[job_id], current.get(job_id)
        if (
            now is not None
            and now.gpu_type == lease.gpu_type
            and len(now.devices) == lease.gpus
            and all(device in free.get(now.host, ()) for device in now.devices)
        ):
            placed[job_id] = now
            free[now.host] = [d for d in free[now.host] if d not in now.devices]
    waiting = sorted(
        (job_id for job_id in plan.leases if job_id not in placed),
        key=lambda job_id: (-plan.leases[job_id].gpus, job_id),
    )
    for job_id in waiting:
        lease = plan.leases[job_id]
        fitting = [
            host
            for host in free
            if types[host] == lease.gpu_type and len(free[host]) >= lease.gpus > 0
        ]
        if not fitting:
            continue

        def fit(name: str, gpus: int = lease.gpus) -> tuple[int, float]:
            return len(free[name]), -lease_speed(free[name][:gpus], speeds[name])

        host = min(fitting, key=fit)  # min() keeps the first of ties
        devices = tuple(free[host][: lease.gpus])
        free[host] = free[host][lease.gpus :]
        placed[job_id] = Placement(host, lease.gpu_type, devices)
    return placed


def _fastest_first(host: HostDevices) -> list[str]:
    """The host's devices, fastest first (in the host's order among equals)."""
    speed = host.speed_of()
    return sorted(host.devices, key=lambda device: -speed[device])
