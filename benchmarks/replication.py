"""What replication costs: three ReplicatedKernel processes in one Raft group, driven directly.

    python benchmarks/replication.py [--cells 100] [--sizes 100,1000] [--json OUT]

Measures, in one run on this machine, with no gateway in between (jupyter_client talks to each
replica; the Raft group and the object store are real):

- group start: three replicas launched, then joined (until every join reply arrived);
- trivial-cell round trip (``x = 1``, execute_reply + idle) on a joined replica against a plain
  ipykernel started the same way: the difference is the LEAD commit before the cell and the
  delta publish after it;
- for each size (MB of float64): the round trip of the cell that creates the array on replica A,
  then how long until replica B holds it, measured from the moment that cell was sent to the
  reply of a cell on B that reads it (B's LEAD barrier waits until the delta is applied).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from kernelfleet.kernels.agent.app import PACKAGED_KERNELSPECS
from kernelfleet.protocol import ReplicaEnv, Request
from kernelfleet.testing import free_port, percentile


def start(kernel_name: str, root: Path, replica_id: str, ksm: KernelSpecManager) -> Any:
    env = {
        **os.environ,
        ReplicaEnv.REPLICA_ID.value: replica_id,
        ReplicaEnv.REPLICA_DIR.value: str(root / replica_id),
    }
    km = KernelManager(kernel_name=kernel_name, kernel_spec_manager=ksm)
    km.start_kernel(env=env, stderr=(root / f"{replica_id}.log").open("wb"))
    client = km.client()
    client.start_channels()
    client.wait_for_ready(60)
    return km, client


def run(client: Any, code: str, timeout: float = 600) -> float:
    """Seconds until the cell's execute_reply and idle status arrived; fails on an error."""
    started = time.perf_counter()
    msg_id = client.execute(code)
    reply = idle = False
    while not (reply and idle):
        if not reply:
            answer = client.get_shell_msg(timeout=timeout)
            if answer["parent_header"].get("msg_id") == msg_id:
                if answer["content"]["status"] != "ok":
                    raise RuntimeError(f"{code!r} failed: {answer['content']}")
                reply = True
        message = client.get_iopub_msg(timeout=timeout)
        if message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "status":
            idle = message["content"]["execution_state"] == "idle"
    return time.perf_counter() - started


def join(clients: list[Any], root: Path) -> float:
    addresses = [f"127.0.0.1:{free_port()}" for _ in clients]
    started = time.perf_counter()
    for index, client in enumerate(clients):
        peers = [a for a in addresses if a != addresses[index]]
        content = {
            "replica_id": f"r{index}",
            "address": addresses[index],
            "peers": peers,
            "password": "benchmark-password",
            "store_root": str(root / "objects"),
        }
        client.shell_channel.send(client.session.msg(Request.JOIN.value, content))
    for client in clients:
        reply = client.get_shell_msg(timeout=60)
        if reply["content"].get("status") != "ok":
            raise RuntimeError(f"join failed: {reply['content']}")
    return time.perf_counter() - started


def round_trips(client: Any, cells: int) -> dict[str, float]:
    for _ in range(10):
        run(client, "x = 1")
    ms = [run(client, "x = 1") * 1000 for _ in range(cells)]
    return {"p50": statistics.median(ms), "p99": percentile(ms, 99), "mean": statistics.fmean(ms)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kernelfleet-replication-"))
    ksm = KernelSpecManager()
    ksm.kernel_dirs.append(str(PACKAGED_KERNELSPECS))
    kernels: list[Any] = []
    try:
        started = time.perf_counter()
        for index in range(3):
            kernels.append(start("kernelfleet-python3", root, f"r{index}", ksm))
        launched = time.perf_counter() - started
        joined = join([client for _, client in kernels], root)
        plain = start("python3", root, "plain", ksm)
        kernels.append(plain)
        a, b = kernels[0][1], kernels[1][1]
        report: dict[str, Any] = {
            "group_start_s": {"launch_3": launched, "join": joined},
            "roundtrip_ms": {
                "replicated": round_trips(a, args.cells),
                "plain": round_trips(plain[1], args.cells),
            },
            "sync": {},
        }
        run(a, "import numpy as np")
        for size in args.sizes:
            sent = time.perf_counter()
            critical = run(a, f"big_{size} = np.full({size} * 2**20 // 8, 1.0)")
            run(b, f"assert big_{size}.size == {size} * 2**20 // 8")
            report["sync"][f"{size}MB"] = {
                "cell_s": critical,
                "follower_holds_s": time.perf_counter() - sent,
            }
            run(a, f"del big_{size}")
        return report
    finally:
        for km, client in kernels:
            client.stop_channels()
            km.shutdown_kernel(now=True)


def render(report: dict[str, Any]) -> str:
    rt = report["roundtrip_ms"]
    lines = [
        f"3 replicas launched in {report['group_start_s']['launch_3']:.2f} s, "
        f"joined in {report['group_start_s']['join']:.2f} s",
        f"{'round trip (x = 1)':<28}{'p50':>9}{'p99':>9}{'mean':>9}",
    ]
    for name in ("plain", "replicated"):
        f = rt[name]
        lines.append(f"{name:<28}{f['p50']:>7.2f}ms{f['p99']:>7.2f}ms{f['mean']:>7.2f}ms")
    ratio = rt["replicated"]["p50"] / rt["plain"]["p50"]
    lines.append(f"{'replicated / plain (p50)':<28}{ratio:>8.2f}x")
    for size, figures in report["sync"].items():
        lines.append(
            f"{size:>7} array: cell {figures['cell_s']:.2f} s, "
            f"follower holds it {figures['follower_holds_s']:.2f} s after the cell was sent"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--sizes", default="100,1000", help="array sizes in MB, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",") if size]
    report = measure(args)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
