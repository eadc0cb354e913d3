"""Ports for a host agent's replicas: free now, and below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORTS_FROM = 20000  # replicas' ZMQ and Raft ports are drawn from here up to the ephemeral range


def free_ports(ip: str, count: int, avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """`count` distinct ports free on `ip` now, for a replica to bind once it starts.

    They are drawn below the kernel's ephemeral range: a port from that range (what binding to
    port 0 gives, and what jupyter_client picks by default) can be taken by any outgoing
    connection before the replica binds it.
    """
    low = ephemeral_range()[0]
    held: list[socket.socket] = []
    try:
        for port in random.sample(range(PORTS_FROM, low), k=min(256, low - PORTS_FROM)):
            if port in avoid:
                continue
            sock = socket.socket()
            try:
                sock.bind((ip, port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            if len(held) == count:
                break
        while len(held) < count:  # the low range is crowded: fall back to the kernel's choice
            sock = socket.socket()
            sock.bind((ip, 0))
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections and port 0 (Linux: from /proc)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
