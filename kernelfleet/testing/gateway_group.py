"""A replicated gateway for tests: three members, the proxy in front of them, host agents.

`GatewayGroup.start` runs three ``kernelfleet gateway --group-members ...`` processes (each with
its own state folder, one shared object store), a ``kernelfleet gateway-proxy`` over them, and
host agents that reach the gateway through the proxy, as docs/deploy.md says to run them. Its
`fleet` is a `Fleet` whose URL is the proxy's: every request and websocket of a test goes the
way a user's would.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kernelfleet.gateway.processes import kill_group, terminate
from kernelfleet.runtime_file import GatewayRuntime, read_runtime
from kernelfleet.testing.deadlines import wait_for
from kernelfleet.testing.fleet import TOKEN, Fleet
from kernelfleet.testing.http import call_json
from kernelfleet.testing.processes import free_port

MEMBERS = 3
STANDS_BY = "stands by on port"
"""What a member logs once it answers as a standby."""


@dataclass
class GatewayGroup:
    """Three gateway members, a proxy and the hosts of `fleet` (whose URL is the proxy's)."""

    fleet: Fleet
    root: Path
    member_args: tuple[str, ...] = ()
    raft_addresses: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    members: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    proxy: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls, root: Path, hosts: int = 3, gpus: int = 1, member_args: tuple[str, ...] = ()
    ) -> GatewayGroup:
        """The group, its proxy, and `hosts` agents (``host-1``...) with `gpus` GPUs each,
        all registered through the proxy."""
        root.mkdir(parents=True, exist_ok=True)
        group = cls(Fleet(state_dir=root, token=TOKEN, env={}), root, member_args)
        group.raft_addresses = [f"127.0.0.1:{free_port()}" for _ in range(MEMBERS)]
        group.ports = [free_port() for _ in range(MEMBERS)]
        try:
            for i in range(MEMBERS):
                group.start_member(i)
            group.start_proxy()
            wait_for(lambda: group.serving() is not None, 30, "a member to serve")
            for i in range(1, hosts + 1):
                group.fleet.start_host(f"host-{i}", gpus)
        except BaseException:
            group.stop()
            raise
        return group

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def restart_member(self, i: int) -> None:
        """Start member `i` again, as its supervisor would, and wait until it stands by."""
        before = self.log(i).count(STANDS_BY)
        self.start_member(i)
        wait_for(lambda: self.log(i).count(STANDS_BY) > before, 30, f"member {i} to stand by")

    def start_member(self, i: int) -> None:
        """Start member `i` on its port and folder."""
        self.members[i] = self.fleet.spawn(
            f"member-{i}", "gateway", "--ip", "127.0.0.1", "--port", str(self.ports[i]),
            "--state-dir", str(self.root / f"member-{i}"),
            "--group-members", ",".join(self.raft_addresses),
            "--group-address", self.raft_addresses[i],
            "--GatewayApp.object_store_root", str(self.root / "objects"),
            "--GatewayApp.kernel_pool_size=0", "--replicas", "3", *self.member_args,
        )  # fmt: skip

    def start_proxy(self) -> None:
        folder = self.root / "proxy"
        proxy = self.proxy = self.fleet.spawn(
            "proxy", "gateway-proxy", "--ip", "127.0.0.1", "--port", "0",
            "--members", ",".join(self.url(i) for i in range(MEMBERS)),
            "--state-dir", str(folder),
        )  # fmt: skip

        def listening() -> bool:
            assert proxy.poll() is None, self.fleet.log("proxy")[-3000:]
            runtime = read_runtime(folder, GatewayRuntime, proxy.pid)
            if runtime is not None:
                self.fleet.url = runtime.url
            return runtime is not None

        wait_for(listening, 30, "the proxy's runtime file")

    def serving(self, excluding: int | None = None) -> int | None:
        """The member (other than `excluding`) that answers ``/api/fleet/serving`` with 200,
        if one does."""
        for i in set(range(MEMBERS)) - {excluding}:
            try:
                status, _ = call_json(self.url(i) + "/api/fleet/serving", token=TOKEN, timeout=2)
            except OSError:
                continue
            if status == 200:
                return i
        return None

    def kill_member(self, i: int) -> None:
        """SIGKILL member `i`, as when its machine is lost."""
        os.killpg(self.members[i].pid, signal.SIGKILL)
        self.members[i].wait(20)

    def signal_member(self, i: int, signum: int) -> None:
        os.killpg(self.members[i].pid, signum)

    def log(self, i: int) -> str:
        return self.fleet.log(f"member-{i}")

    def stop(self) -> None:
        """Stop the hosts, the proxy and the members; SIGKILL what lingers."""
        self.fleet.stop()
        processes = [*self.members.values(), *([self.proxy] if self.proxy else [])]
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGCONT)
        terminate(processes, 10)
        for process in processes:
            kill_group(process)
