"""The memory a kernel's processes hold, from ``/proc/<pid>/smaps_rollup`` (Linux).

RSS counts every page a process maps, shared or not; PSS divides each shared page among the
processes that map it, so the PSS of several processes adds up to what they cost together. A
kernel's figure is the sum over its processes: the one ipykernel of a local kernel, or the
replica processes of a kernelfleet kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kernelfleet.protocol import ReplicaEnv
from kernelfleet.testing import descendants

PROC = Path("/proc")


def rollup_kib(pid: int) -> dict[str, int]:
    """``Rss`` and ``Pss`` of `pid` in KiB, as its smaps_rollup states them."""
    figures: dict[str, int] = {}
    for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            figures[name] = int(rest.split()[0])
    if set(figures) != {"Rss", "Pss"}:
        raise RuntimeError(f"process {pid}: no Rss/Pss in its smaps_rollup")
    return figures


def memory_of(pids: Iterable[int]) -> dict[str, float]:
    """The processes' count, and their summed RSS and PSS in MiB."""
    rollups = [rollup_kib(pid) for pid in pids]
    if not rollups:
        raise RuntimeError("no processes to measure")
    return {
        "processes": len(rollups),
        "rss_mib": sum(r["Rss"] for r in rollups) / 1024,
        "pss_mib": sum(r["Pss"] for r in rollups) / 1024,
    }


def local_kernel_pids(server_pid: int) -> list[int]:
    """The ipykernel processes jupyter_server `server_pid` started (its descendants)."""
    return [pid for pid in descendants(server_pid) if "ipykernel" in _cmdline(pid)]


def replica_pids(agent_pids: Iterable[int], kernel_id: str) -> list[int]:
    """The replica processes of fleet kernel `kernel_id` under the host agents `agent_pids`:
    those whose environment names the kernel (the agent sets it on every replica it starts)."""
    wanted = f"{ReplicaEnv.KERNEL_ID.value}={kernel_id}".encode()
    found = []
    for agent in agent_pids:
        for pid in descendants(agent):
            try:
                environ = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
            except OSError:
                continue  # exited meanwhile
            if wanted in environ:
                found.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
