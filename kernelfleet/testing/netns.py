"""Host agents in network namespaces of their own, and their links cut and healed (Linux only,
root or CAP_NET_ADMIN).

Topology (`build_topology`; `Topology.destroy` removes it all)::

      root namespace: gateway on 10.O.1.1 (bridge kfc-*), the caller's own clients
        |                                            |
      bridge kfc-<sfx> 10.O.1.0/24 (control)       bridge kfr-<sfx> 10.O.2.0/24 (Raft)
        | kc<i>-<sfx> (port)                           | kr<i>-<sfx> (port)
        |                                            |
      namespace kf-<sfx>-<i>:  ctl0 10.O.1.<i+1>       raft0 10.O.2.<i+1>
        host agent host-<i>: --ip/--kernel-ip on ctl0 (agent API, replicas' ZMQ),
                             --raft-ip on raft0 (the replicas' pysyncobj ports)

One host agent runs in each namespace (``ip netns exec``, `start_host_in`); its replicas
inherit it. Gateway <-> agent (HTTP, heartbeats) and gateway <-> replica (ZMQ) traffic uses the
control bridge only, Raft traffic the Raft bridge only: the two are plain L2 bridges, so no
routing or ip_forward is needed. `Topology.cut` sets a host's port on a bridge down, as if its
cable were pulled at the switch: its packets and those sent to it are silently lost, the
namespace keeps its address; `Topology.heal` sets it up again. Cutting only the Raft port
isolates a host's replicas from their groups while its heartbeats and channels go on; cutting
both isolates the machine.
"""

from __future__ import annotations

import random
import secrets
import subprocess
from collections.abc import Collection
from dataclasses import dataclass, field

from kernelfleet.testing.fleet import Fleet

RAFT = "r"
"""The Raft bridge's letter in port names (``kr<i>-<sfx>``)."""
CONTROL = "c"
"""The control bridge's letter (``kc<i>-<sfx>``): the gateway's HTTP, heartbeats and ZMQ."""


class NamespacesUnavailable(RuntimeError):
    """This machine cannot make network namespaces (no ``ip`` command, or not root)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; `check`: raise `CalledProcessError` if it fails."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@dataclass
class Topology:
    """The namespaces and bridges of `hosts` hosts (numbered from 1), named by `suffix`, on
    10.`octet`.0.0/16."""

    suffix: str
    octet: int
    hosts: int
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # root-side devices, deleted at the end

    @property
    def gateway_ip(self) -> str:
        return f"10.{self.octet}.1.1"

    def namespace(self, i: int) -> str:
        return f"kf-{self.suffix}-{i}"

    def control_ip(self, i: int) -> str:
        return f"10.{self.octet}.1.{i + 1}"

    def raft_ip(self, i: int) -> str:
        return f"10.{self.octet}.2.{i + 1}"

    def port(self, i: int, bridge: str = RAFT) -> str:
        """Host i's port on `bridge` (`RAFT` or `CONTROL`), in the root namespace."""
        return f"k{bridge}{i}-{self.suffix}"

    def raft_port(self, i: int) -> str:
        return self.port(i, RAFT)

    def cut(self, i: int, bridges: Collection[str] = (RAFT,)) -> None:
        """Pull host i's cables on `bridges` (its Raft link only, by default)."""
        for bridge in bridges:
            ip("link", "set", self.port(i, bridge), "down")

    def heal(self, i: int, bridges: Collection[str] = (RAFT,)) -> None:
        """Plug host i's cables on `bridges` back in."""
        for bridge in bridges:
            ip("link", "set", self.port(i, bridge), "up")

    def destroy(self) -> None:
        """Delete every link and namespace made (a veth end takes its peer along)."""
        for link in reversed(self.links):
            ip("link", "del", link, check=False)
        for namespace in self.namespaces:
            ip("netns", "del", namespace, check=False)


def _free_octet() -> int:
    """A second octet whose 10.O.0.0/16 no address or route here overlaps."""
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route", "show", "table", "all").stdout
    candidates = list(range(100, 250))
    random.shuffle(candidates)
    for octet in candidates:
        if f"10.{octet}." not in used:
            return octet
    raise NamespacesUnavailable("no free 10.O.0.0/16 for the bridges")


def build_topology(hosts: int = 3) -> Topology:
    """Make the two bridges and `hosts` namespaces, each with a port on both; on a failure
    part-way, what was made is removed. `NamespacesUnavailable` when this machine cannot."""
    suffix = secrets.token_hex(3)
    try:
        topology = Topology(suffix=suffix, octet=_free_octet(), hosts=hosts)
    except FileNotFoundError as e:
        raise NamespacesUnavailable("the `ip` command (iproute2) is missing") from e
    first = topology.namespace(1)
    probe = ip("netns", "add", first, check=False)
    if probe.returncode != 0:
        raise NamespacesUnavailable(
            f"cannot create a network namespace (needs root / CAP_NET_ADMIN): "
            f"`ip netns add {first}`: {probe.stderr.strip()}"
        )
    topology.namespaces.append(first)
    try:
        for bridge, address in ((f"kf{CONTROL}-{suffix}", f"{topology.gateway_ip}/24"),
                                (f"kf{RAFT}-{suffix}", None)):  # fmt: skip
            ip("link", "add", bridge, "type", "bridge")
            topology.links.append(bridge)
            if address:
                ip("addr", "add", address, "dev", bridge)
            ip("link", "set", bridge, "up")
        for i in range(1, hosts + 1):
            namespace = topology.namespace(i)
            if i > 1:
                ip("netns", "add", namespace)
                topology.namespaces.append(namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
            for kind, inside, address in ((CONTROL, "ctl0", topology.control_ip(i)),
                                          (RAFT, "raft0", topology.raft_ip(i))):  # fmt: skip
                port = topology.port(i, kind)
                ip("link", "add", port, "type", "veth", "peer", "name", inside, "netns", namespace)
                topology.links.append(port)
                ip("link", "set", port, "master", f"kf{kind}-{suffix}")
                ip("link", "set", port, "up")
                ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
                ip("-n", namespace, "link", "set", inside, "up")
    except BaseException:
        topology.destroy()
        raise
    return topology


def start_host_in(fleet: Fleet, topology: Topology, i: int, gpus: int = 1) -> None:
    """Start host agent ``host-<i>`` in namespace i (its API and kernels on the control link,
    Raft on the Raft link) and wait until the gateway lists it alive."""
    address, raft = topology.control_ip(i), topology.raft_ip(i)
    fleet.start_host(
        f"host-{i}", gpus, "--ip", address, "--kernel-ip", address, "--raft-ip", raft,
        launcher=("ip", "netns", "exec", topology.namespace(i)),
    )  # fmt: skip
