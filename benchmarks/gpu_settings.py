"""What setting GPU clocks and power limits from a notebook costs, and how soon a cell's end
resets them (virtual GPUs: the path of kernel -> gateway -> host agent, without NVML's own time).

    python benchmarks/gpu_settings.py [--cells 20]

One gateway, one host agent with 1 virtual GPU, one kernel of one replica. Each `%%gpus 1`
cell times, with its kernel token, `FleetClient.set_gpu_settings(power_limit_w=...)`, a dry run,
`gpu_settings()` and `reset_gpu_settings()`, then sets a limit again and ends. The driver then
polls the agent's own API (every ~2 ms) until the device is back to its default: the time from
the cell's reply to that is the release-to-reset time. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from kernelfleet.testing import call_json, percentile, start_fleet

CELL = """%%gpus 1
import json, time
from kernelfleet.client import FleetClient
client = FleetClient.from_environment()
took = {}
for name, call in (
    ("set", lambda: client.set_gpu_settings(power_limit_w=POWER)),
    ("dry_run", lambda: client.set_gpu_settings(gpu_clock_mhz=1005, dry_run=True)),
    ("read", client.gpu_settings),
    ("reset", client.reset_gpu_settings),
):
    start = time.perf_counter()
    call()
    took[name] = (time.perf_counter() - start) * 1000
client.set_gpu_settings(power_limit_w=POWER)
print("took", json.dumps(took), flush=True)
"""


def summary(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50):.1f} ms, p95 {percentile(values, 95):.1f} ms, "
        f"max {max(values):.1f} ms (n={len(values)})"
    )


async def run(cells: int) -> None:
    fleet = start_fleet(Path(tempfile.mkdtemp(prefix="kf-gpu-settings-")), hosts=1, gpus=1)
    try:
        agent = fleet.api("GET", "/api/fleet/hosts")[0]["address"] + "/api/gpu-settings"
        kernel_id = fleet.start_kernel()
        ws = await fleet.connect(kernel_id)
        calls: dict[str, list[float]] = {}
        resets: list[float] = []
        for i in range(cells):
            result = await ws.execute(CELL.replace("POWER", str(150 + i)))
            replied = time.perf_counter()
            assert result.reply["status"] == "ok", result.reply
            line = next(x for x in result.stdout.splitlines() if x.startswith("took "))
            for name, ms in json.loads(line.removeprefix("took ")).items():
                calls.setdefault(name, []).append(ms)
            while True:
                device = call_json(agent, token=fleet.token)[1]["devices"][0]
                if device["owner"] is None and device["current"] == device["default"]:
                    break
                await asyncio.sleep(0.002)
            resets.append((time.perf_counter() - replied) * 1000)
        ws.close()
        print(f"{cells} cells, 1 virtual GPU; from inside the cell, through the gateway:")
        for name, values in calls.items():
            print(f"  {name:8s} {summary(values[1:] or values)}")
        print(f"  cell reply -> device reset seen on the agent: {summary(resets)}")
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20)
    asyncio.run(run(parser.parse_args().cells))


if __name__ == "__main__":
    main()
