"""Failover when the executor's whole host is lost, with and without the agents' gateway link.

    python benchmarks/failover.py [--rounds 5] [--hosts 3] [--quiet-seconds 60] [--load 4]

For each mode (``link``: agents keep their websocket to the gateway, the default; ``heartbeat``:
``--HostAgentApp.link_to_gateway=False``, so only the 5 s heartbeat timeout tells), one fleet
(gateway + `--hosts` agents, kernels of 3 replicas) and one kernel. Each round:

1. run a cell (``n += 1``) and read which replica executes, and on which host;
2. SIGKILL that host's agent and every process under it (its replicas): the machine is gone;
3. time from the kill to the reply of the next cell (``n``), which must print the count so far:
   this is the failover time (the cell waits in the gateway until the loss is seen and a
   surviving replica takes over);
4. start the host again and wait until the kernel is whole (its ``degraded`` is null again).

Then, false alarms: with `--load` busy processes hogging the CPUs for `--quiet-seconds`, count
``host-lost`` events (none is due: every host is alive). Prints the figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelfleet.testing import percentile, start_fleet, wait_for
from kernelfleet.testing.fleet import Fleet

MODES = {"link": (), "heartbeat": ("--HostAgentApp.link_to_gateway=False",)}


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def whole(fleet: Fleet, kernel_id: str) -> bool:
    model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    ready = [r for r in model["replicas"] if r["state"] in ("ready", "executing")]
    return model["degraded"] is None and len(ready) == 3


def lost_events(fleet: Fleet) -> list[dict[str, Any]]:
    return [e for e in fleet.api("GET", "/api/fleet/events?n=1000") if e["type"] == "host-lost"]


async def measure(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    fleet = start_fleet(root / mode, hosts=0, gpus=1, replicas=3)
    try:
        for i in range(1, args.hosts + 1):
            fleet.start_host(f"host-{i}", 1, *MODES[mode])
        kernel_id = fleet.start_kernel()
        client = await fleet.connect(kernel_id)
        try:
            assert (await client.execute("n = 0")).reply["status"] == "ok"
            times = []
            for count in range(1, args.rounds + 1):
                assert (await client.execute("n += 1")).reply["status"] == "ok"
                model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
                (executor,) = [r for r in model["replicas"] if r["id"] == model["executor"]]
                host = executor["host"]
                killed = time.monotonic()
                fleet.signal_host(host, signal.SIGKILL)
                reply = await client.execute("print(n)", timeout=120)
                took = time.monotonic() - killed
                assert reply.stdout == f"{count}\n", reply.stdout
                times.append(took)
                print(f"  [{mode}] round {count}: {host} lost, next cell after {took:.2f} s")
                fleet.start_host(host, 1, *MODES[mode])
                wait_for(lambda: whole(fleet, kernel_id), 120, "the kernel whole again")
        finally:
            client.close()
        before = len(lost_events(fleet))
        hogs = [
            multiprocessing.Process(target=_spin, args=(args.quiet_seconds,))
            for _ in range(args.load)
        ]
        for hog in hogs:
            hog.start()
        for hog in hogs:
            hog.join()
        false_alarms = len(lost_events(fleet)) - before
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        fleet.stop()
    return {
        "mode": mode,
        "failover_s": times,
        "p50_s": percentile(times, 50),
        "max_s": max(times),
        "false_host_losses": false_alarms,
        "quiet_seconds": args.quiet_seconds,
        "load_processes": args.load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--quiet-seconds", type=float, default=60.0)
    parser.add_argument("--load", type=int, default=4, help="busy processes while quiet")
    parser.add_argument("--modes", default="heartbeat,link")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="kernelfleet-failover-") as root:
        for mode in args.modes.split(","):
            results.append(asyncio.run(measure(mode, args, Path(root))))
    print("\nmode       failover p50   max     false host losses (load, seconds)")
    for r in results:
        print(
            f"{r['mode']:<10} {r['p50_s']:>8.2f} s {r['max_s']:>6.2f} s   "
            f"{r['false_host_losses']} ({r['load_processes']} busy processes, "
            f"{r['quiet_seconds']:.0f} s)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
