"""Replica start: a process replica versus a container replica, on one host agent, in one run.

    python benchmarks/container_start.py --image TAG [--engine URL] [--starts 10] [--raft]

TAG is a kernel image on the engine (``kernelfleet image build --base ... --tag TAG``); URL is
the Docker Engine API (default $DOCKER_HOST). One real host agent (``kernelfleet host``, no
gateway) serves both kinds: the packaged ``kernelfleet-python3`` kernelspec (a process) and a
kernelspec of TAG written to a temporary JUPYTER_PATH (a container). Starts alternate between the
two, so background load falls on both alike. Each sample is ``POST /api/replicas`` until the
agent answered (the kernel answered ``kernel_info``), then ``DELETE`` until the replica is gone
(container removed, folder swept). Prints min / median / max per kind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kernelfleet.gateway.processes import spawn_kernelfleet, terminate
from kernelfleet.kernels.agent.client import HostAgentClient
from kernelfleet.kernels.agent.containers.engine import default_engine_url
from kernelfleet.kernels.agent.containers.images import kernelspec, write_kernelspec
from kernelfleet.runtime_file import AgentRuntime, read_runtime

KINDS = {"process": "kernelfleet-python3", "container": "kf-bench-container"}


async def measure(address: str, token: str, starts: int, raft: bool) -> dict[str, dict]:
    client = HostAgentClient(address, token)
    samples: dict[str, dict[str, list[float]]] = {kind: {"start": [], "stop": []} for kind in KINDS}
    try:
        for i in range(starts):
            for kind, name in KINDS.items():
                replica = f"bench-{kind}-{i}"
                t0 = time.perf_counter()
                await client.start_replica(replica, f"k-{replica}", name, raft=raft)
                t1 = time.perf_counter()
                await client.stop_replica(replica)
                t2 = time.perf_counter()
                samples[kind]["start"].append(t1 - t0)
                samples[kind]["stop"].append(t2 - t1)
    finally:
        client.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True, help="a kernel image on the engine")
    parser.add_argument("--engine", default=default_engine_url())
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--raft", action="store_true", help="reserve a Raft port (replicated)")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-bench-"))
    token = secrets.token_hex(16)
    write_kernelspec(
        folder / "jupyter" / "kernels" / KINDS["container"],
        kernelspec(args.image, f"{args.image} (benchmark)"),
    )
    state = folder / "agent"
    env = {"JUPYTER_PATH": str(folder / "jupyter")}
    argv = ["host", "--state-dir", str(state), "--port", "0", "--root-dir", str(folder)]
    argv += ["--container-engine", args.engine, "--kernel-user", "same"]
    agent = spawn_kernelfleet(argv, folder / "agent.log", token, env)
    try:
        deadline = time.monotonic() + 60
        runtime = None
        while runtime is None:
            if agent.poll() is not None or time.monotonic() > deadline:
                raise SystemExit((folder / "agent.log").read_text()[-3000:])
            runtime = read_runtime(state, AgentRuntime, agent.pid)
            time.sleep(0.1)
        samples = asyncio.run(measure(runtime.address, token, args.starts, args.raft))
    finally:
        terminate([agent], 10)
        shutil.rmtree(folder, ignore_errors=True)

    print(f"replica start and stop on one agent, {args.starts} of each, alternating "
          f"(image {args.image}, engine {args.engine}, cpus {os.cpu_count()})")  # fmt: skip
    print(f"{'kind':<10} {'what':<6} {'min s':>7} {'median s':>9} {'max s':>7}")
    for kind, by_what in samples.items():
        for what, values in by_what.items():
            print(f"{kind:<10} {what:<6} {min(values):7.2f} {statistics.median(values):9.2f} "
                  f"{max(values):7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
