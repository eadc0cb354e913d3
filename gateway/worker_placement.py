"""Where a cell's tool workers go: which hosts, which of their devices.

A pure function of the free devices (`place_workers`): the gateway's tool-workers service
(`kernelfleet.gateway.tool_workers`) feeds it what the GPU ledger says each host could hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kernelfleet.errors import Conflict


@dataclass(frozen=True)
class WorkerSlot:
    """One worker's place: a host and the devices it gets there."""

    host_id: str
    device_ids: tuple[str, ...]


def place_workers(
    free: Mapping[str, Sequence[str]],
    count: int,
    gpus_each: int,
    *,
    prefer: str | None = None,
    total: int | None = None,
) -> list[WorkerSlot]:
    """Place `count` workers of `gpus_each` devices each (`gpus_each` >= 1) on the hosts of
    `free` (host -> its free devices, in the order they should be taken).

    The host `prefer` (the kernel's executor's) is filled first, then the hosts that fit the
    most workers, so the workers span as few hosts as they can (taking the largest hosts
    first is optimal for that); ties go to the lower host id. A worker's devices are all on
    one host. Workers come back host by host, in that order.

    `Conflict` (409: the request waits for nothing) naming the counts, when the fleet could
    never fit them (`total`: how many GPUs its hosts have in all) or too few are free now.
    """
    fits = {host: len(devices) // gpus_each for host, devices in free.items()}
    need = count * gpus_each
    largest = max((len(devices) for devices in free.values()), default=0)
    if total is not None and need > total:
        raise Conflict(
            f"{count} worker(s) of {gpus_each} GPU(s) need {need} GPUs; the fleet has {total}"
        )
    if sum(fits.values()) < count:
        free_gpus = sum(len(devices) for devices in free.values())
        raise Conflict(
            f"{count} worker(s) of {gpus_each} GPU(s) need {need} GPUs, {gpus_each} on one "
            f"host each; {free_gpus} are free now (at most {largest} on one host), room for "
            f"{sum(fits.values())} worker(s)"
        )
    order = sorted(free, key=lambda host: (host != prefer, -fits[host], host))
    slots: list[WorkerSlot] = []
    for host in order:
        devices = list(free[host])
        while len(slots) < count and len(devices) >= gpus_each:
            slots.append(WorkerSlot(host, tuple(devices[:gpus_each])))
            del devices[:gpus_each]
    return slots
