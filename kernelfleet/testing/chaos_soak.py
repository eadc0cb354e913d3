"""One chaos soak from start to verdict: a fleet, kernels running counting cells, faults, then
the figures (``benchmarks/chaos.py`` prints them; ``tests/gateway/test_chaos.py`` asserts on them).

`run_soak` starts a `ChaosFleet`, starts `kernels` kernels and a `KernelDriver` for each, runs
the `ChaosLoop` for `duration` s, stops injecting, waits (up to `Soak.heal_timeout` s) for the
fleet to be whole, stops the drivers, reads each kernel's lists through the gateway and from every
live replica, and returns the report (`figures`); the fleet is stopped whatever happens.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.testing.chaos import (
    KernelDriver,
    KernelVerdict,
    Outcome,
    Workload,
    judge,
    read_lists,
    read_replicas,
)
from kernelfleet.testing.chaos_faults import ChaosFleet, ChaosLoop, Fault, FaultKind, Soak, Watch
from kernelfleet.testing.stats import percentile


@dataclass
class SoakConfig:
    duration: float = 300.0
    kernels: int = 3
    hosts: int = 3
    seed: int = 0
    soak: Soak = field(default_factory=Soak)
    workload: Workload = field(default_factory=Workload)

    def model(self) -> dict[str, Any]:
        model = asdict(self)
        model["soak"]["kinds"] = [kind.value for kind in self.soak.kinds]
        return model


async def run_soak(root: Path, config: SoakConfig) -> dict[str, Any]:
    """Run one soak in folder `root` (the fleet's logs stay there); its report."""
    namespaces = FaultKind.CUT_NETWORK in config.soak.kinds
    replicas = min(config.soak.replicas, config.hosts)
    chaos = await asyncio.to_thread(ChaosFleet.start, root, config.hosts, 1, namespaces, replicas)
    drivers: list[KernelDriver] = []
    try:
        for _ in range(config.kernels):
            kernel_id = await asyncio.to_thread(chaos.fleet.start_kernel)
            drivers.append(KernelDriver(chaos.fleet, kernel_id, config.workload))
        for driver in drivers:
            await driver.setup()
        watch = Watch(chaos, [d.kernel_id for d in drivers], replicas)
        watch.take(await asyncio.to_thread(chaos.snapshot), 0.0)
        watch.initial = sum(len(ids) for ids in watch.replica_ids.values())
        loop = ChaosLoop(chaos, watch, config.soak, random.Random(config.seed))
        started = time.time()
        stop_chaos, stop_cells, stop_watch = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(d.run(stop_cells)) for d in drivers]
        watching = asyncio.create_task(watch.poll(stop_watch))
        chaos_task = asyncio.create_task(loop.run(stop_chaos))
        try:
            await asyncio.sleep(config.duration)
        finally:
            stop_chaos.set()
            await chaos_task
        chaos_ended = time.time()
        deadline = time.monotonic() + config.soak.heal_timeout
        while True:  # the drivers go on meanwhile
            if watch.whole(config.hosts, chaos_ended, settled=True) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        healed_in = time.time() - chaos_ended
        stop_cells.set()
        await asyncio.gather(*tasks)
        verdicts: list[KernelVerdict] = []
        for driver in drivers:
            lists = await read_lists(driver)
            seen = await read_replicas(chaos.fleet, driver.kernel_id) if lists else {}
            verdicts.append(judge(driver, lists, seen))
            verdicts[-1].replicas = await asyncio.to_thread(replica_states, chaos, driver.kernel_id)
        stop_watch.set()
        await watching
        return figures(config, drivers, verdicts, loop, watch, chaos_ended - started, healed_in)
    finally:
        for driver in drivers:
            driver.close()
        await asyncio.to_thread(chaos.stop)


def replica_states(chaos: ChaosFleet, kernel_id: str) -> dict[str, str]:
    """``{replica id: "host state"}`` from the admin API now (empty if it does not answer)."""
    status, model = chaos.fleet.request("GET", f"/api/fleet/kernels/{kernel_id}")
    if status != 200:
        return {}
    return {r["id"]: f"{r['host']} {r['state']}" for r in model["replicas"]}


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def failover_times(
    faults: list[Fault], drivers: list[KernelDriver], executors_only: bool = False
) -> dict[str, Any]:
    """Per fault and kernel it hit (`executors_only`: whose executor it hit): seconds from the
    fault to the ``ok`` reply of that kernel's first cell sent after the fault (so a cell in
    flight, whether it ran before the fault or was sent again, is waited for: one cell at a
    time). `_summary` of them, all and by `Fault.label`; ``never``: pairs with no such cell."""
    by_id = {d.kernel_id: d for d in drivers}
    samples: dict[str, list[float]] = {}
    never = 0
    for fault in faults:
        for kernel_id in fault.executors if executors_only else fault.kernels:
            driver = by_id[kernel_id]
            done = [c.done for c in driver.cells if c.outcome is Outcome.OK and c.sent >= fault.at]
            if done:
                samples.setdefault(fault.label, []).append(min(done) - fault.at)
            else:
                never += 1
    every = [s for values in samples.values() for s in values]
    return {
        **_summary(every),
        "never": never,
        "by_kind": {kind: _summary(values) for kind, values in sorted(samples.items())},
    }


def figures(
    config: SoakConfig,
    drivers: list[KernelDriver],
    verdicts: list[KernelVerdict],
    loop: ChaosLoop,
    watch: Watch,
    ran_for: float,
    healed_in: float,
) -> dict[str, Any]:
    cells = [c for d in drivers for c in d.cells]
    failed = Counter(f"{c.outcome.value}: {c.error}" for c in cells if c.outcome is not Outcome.OK)
    degraded_s = sum(watch.degraded_s.values())
    return {
        "config": config.model(),
        "chaos_s": round(ran_for, 1),
        "whole_again_after_s": round(healed_in, 1),
        "cells": {
            "sent": len(cells),
            "ok": sum(c.outcome is Outcome.OK for c in cells),
            "failed": sum(c.outcome is not Outcome.OK for c in cells),
            "failed_by_error": dict(failed.most_common()),
            "failed_then_found_applied": sum(bool(c.applied) for c in cells),
            "reconnects": sum(d.reconnects for d in drivers),
        },
        "faults": dict(Counter(f.kind.value for f in loop.faults)),
        "faults_on_a_fleet_not_whole": sum(not f.whole for f in loop.faults),
        "faults_skipped": loop.skipped,
        "failover_s": failover_times(loop.faults, drivers),
        "executor_failover_s": failover_times(loop.faults, drivers, executors_only=True),
        "replacements": watch.replacements,
        "degraded_kernel_s": round(degraded_s, 1),
        "degraded_fraction": round(degraded_s / max(ran_for * len(drivers), 1e-9), 4),
        "degraded_reasons": sorted(watch.reasons)[:10],
        "gateway_unreachable_s": round(watch.unreachable_s, 1),
        "unlisted_kernel_s": round(sum(watch.unlisted_s.values()), 1),
        "lost_kernels": sum(bool(v.lost) for v in verdicts),
        "cells_twice": sum(len(v.twice) for v in verdicts),
        "cells_lost_silently": sum(len(v.lost_silently) for v in verdicts),
        "cells_failed_with_effect": sum(len(v.failed_with_effect) for v in verdicts),
        "check_failures": sum(d.check_failures for d in drivers),
        "replicas_differ": sum(len(v.replicas_differ) for v in verdicts),
        "replicas_checked": sum(v.replicas_checked for v in verdicts),
        "kernels": [v.model() for v in verdicts],
        "fault_log": [f.model() for f in loop.faults],
    }


def render(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    cells = report["cells"]
    config = report["config"]

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = [
        f"chaos soak: {config['kernels']} kernels on {config['hosts']} hosts, "
        f"{report['chaos_s']:.0f} s of faults (seed {config['seed']}); "
        f"whole again {report['whole_again_after_s']:.1f} s after the last",
        f"cells: {cells['sent']} sent, {cells['ok']} ok, {cells['failed']} failed "
        f"({cells['failed_then_found_applied']} of them found applied by the next cell), "
        f"{cells['reconnects']} websocket reconnects",
    ]
    lines += [f"  failed: {count} x {error}" for error, count in cells["failed_by_error"].items()]
    faults = ", ".join(f"{kind} {count}" for kind, count in sorted(report["faults"].items()))
    lines.append(
        f"faults: {faults or 'none'} ({report['faults_on_a_fleet_not_whole']} on a fleet "
        f"not yet whole, {len(report['faults_skipped'])} skipped)"
    )
    for key, what in (("failover_s", "a kernel it hit"), ("executor_failover_s", "a kernel "
                      "whose executor it hit")):  # fmt: skip
        failover = report[key]
        lines.append(
            f"failover (fault -> next ok cell of {what}): p50 {seconds(failover['p50'])}, "
            f"p99 {seconds(failover['p99'])}, max {seconds(failover['max'])} over "
            f"{failover['n']} (never: {failover['never']})"
        )
        for kind, summary in failover["by_kind"].items():
            lines.append(
                f"  {kind:<13} p50 {seconds(summary['p50'])}, p99 {seconds(summary['p99'])}, "
                f"max {seconds(summary['max'])} (n={summary['n']})"
            )
    lines += [
        f"replacements: {report['replacements']}; degraded {report['degraded_kernel_s']:.0f} "
        f"kernel-s ({100 * report['degraded_fraction']:.1f} %); gateway unreachable "
        f"{report['gateway_unreachable_s']:.1f} s; kernels missing from GET /api/kernels "
        f"{report['unlisted_kernel_s']:.1f} kernel-s",
        f"lost kernels: {report['lost_kernels']}; cells run twice: {report['cells_twice']}; "
        f"lost silently: {report['cells_lost_silently']}; failed but applied: "
        f"{report['cells_failed_with_effect']}; check failures: {report['check_failures']}; "
        f"replicas that differ: "
        f"{report['replicas_differ']} of {report['replicas_checked']}",
    ]
    for kernel in report["kernels"]:
        quiet = {"kernel", "replicas_checked"} | (set() if kernel["lost"] else {"replicas"})
        problems = {k: v for k, v in kernel.items() if k not in quiet and v}
        if problems:
            lines.append(f"  kernel {kernel['kernel']}: {problems}")
    return "\n".join(lines)
