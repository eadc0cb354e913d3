"""How many files and ZMQ sockets the gateway and the host agents may hold: raised at start.

Every kernel costs the gateway file descriptors: its clients' websockets, a ZMQ socket per
channel of each replica and the signalling descriptors ZMQ keeps beside each socket. Measured by
``benchmarks/gateway_scale.py`` (docs/performance.md, "At scale"): about 11 for a kernel of one
replica and about 30 for one of three. A host agent holds about 3 per replica. Many Linux systems
start processes with a soft limit of 1024 open files and a hard limit far above it; at 1024 a
gateway stopped at about 90 one-replica or 33 three-replica kernels: every later ZMQ socket,
websocket and accepted connection failed with ``EMFILE`` ("Too many open files").

ZMQ adds a limit of its own: a context holds at most 1023 sockets unless told otherwise. The
gateway's context holds 2 per replica (its output, its heartbeat) and 3 more per replica for
each client's websocket (shell, control, stdin): with one websocket a kernel, 5 a kernel of one
replica, 15 a kernel of three, so at 1023 about 200 and 68 kernels. `max_sockets` sizes it to
the open-files limit instead, which bounds it anyway (every socket holds a descriptor).

`raise_open_files_limit` lifts the soft limit to the hard one, which any process may do; the
processes these start (replicas) inherit it. It changes nothing where the soft limit is already
the hard one, nor where ``resource`` does not exist (not POSIX).

This module imports nothing from kernelfleet: every process may use it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

UNLIMITED_TARGET = 1 << 20
"""The soft limit asked for when the hard limit is unlimited (Linux's default ``nr_open``)."""
FEW_OPEN_FILES = 4096
"""Below this limit, even after raising it, a process logs a warning: ~130 kernels of 3
replicas."""
GATEWAY_FILES_PER_KERNEL = 30
"""File descriptors the gateway holds per kernel of 3 replicas (measured; see above)."""
AGENT_FILES_PER_REPLICA = 3
"""File descriptors a host agent holds per replica it runs (measured; see above)."""


@dataclass(frozen=True)
class OpenFilesLimit:
    """The soft limit before and after `raise_open_files_limit`, and the hard one."""

    before: int
    after: int
    hard: int

    def log(self, log: logging.Logger, per_kernel: str) -> None:
        """Say what was done at INFO, and warn if the limit stays low; `per_kernel` says what
        the limit means for this process (how many kernels, or replicas, it holds)."""
        if self.after > self.before:
            log.info("open files limit raised from %d to %d", self.before, self.after)
        if self.after < FEW_OPEN_FILES:
            log.warning(
                "open files limit is %d (hard limit %d): %s; raise the hard limit (ulimit -Hn, "
                "or LimitNOFILE= in a systemd unit) to hold more",
                self.after,
                self.hard,
                per_kernel,
            )


def raise_open_files_limit() -> OpenFilesLimit | None:
    """Set this process's soft limit of open files to its hard limit (or `UNLIMITED_TARGET`
    when that is unlimited); None without ``resource``. The soft limit is left as it was if
    the system refuses the new one."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # e.g. above nr_open: keep what there is
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    after, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return OpenFilesLimit(soft, after, hard)


def max_sockets(socket_limit: int) -> int:
    """The sockets a ZMQ context of this process may hold: as many as it may open files, up to
    the library's own `socket_limit` (``zmq.SOCKET_LIMIT``); 1023, ZMQ's default, without
    ``resource``."""
    if resource is None:
        return min(1023, socket_limit)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return socket_limit if soft == resource.RLIM_INFINITY else min(soft, socket_limit)
