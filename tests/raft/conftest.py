"""Raft fixtures: real pysyncobj nodes in separate processes on loopback ports.

``raft_cluster(n=3)`` is a factory: it starts `n` ``raft_node.py`` processes (each a
`KernelLog`) on ephemeral 127.0.0.1 ports with data dirs under ``tmp_path`` and returns a
`RaftCluster`; nodes can be killed (SIGKILL), paused (SIGSTOP), restarted from their data dir
and added. Every process is killed at teardown. Each node's log is ``<tmp_path>/<port>.log``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.raft.entries import Entry, decode
from kernelfleet.testing import free_port, wait_for

from .raft_node import from_json, to_json

NODE_SCRIPT = Path(__file__).with_name("raft_node.py")
PASSWORD = "raft-test-password-5f1c"


def wire(entry: Entry) -> Any:
    """An entry as the node script takes it over JSON."""
    return to_json(entry.to_wire())


class NodeFailed(AssertionError):
    """A node answered a request with an error."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(f"{reply.get('error')}({reply.get('reason')}): {reply.get('message')}")
        self.reply = reply
        self.reason = reply.get("reason")


class NodeProcess:
    """One ``raft_node.py`` process and its JSON-line channel."""

    def __init__(
        self, address: str, peers: Iterable[str], password: str, data_dir: Path, log_path: Path
    ) -> None:
        self.address = address
        self.data_dir = data_dir
        self.log_path = log_path
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._eof = False
        self._cond = threading.Condition()
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    str(NODE_SCRIPT),
                    *("--address", address, "--peers", ",".join(peers)),
                    *("--password", password, "--data-dir", str(data_dir)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                bufsize=1,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            message = json.loads(line)
            with self._cond:
                if "id" in message:
                    self._replies[message["id"]] = message
                else:
                    self._events.append(message)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (value := predicate()):
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    pytest.fail(
                        f"{self.address}: {'exited' if self._eof else 'timed out'} waiting for "
                        f"{what}; log tail:\n{self.log_tail()}"
                    )
                self._cond.wait(remaining)
            return value

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_started(self, timeout: float = 15.0) -> dict[str, Any]:
        event = self._wait(lambda: self._events[:1], timeout, "start-up")[0]
        return dict(event)

    def send(self, op: str, **fields: Any) -> int:
        """Send a request without waiting; `reply(id)` collects the answer."""
        request_id = next(self._ids)
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
        self.popen.stdin.flush()
        return request_id

    def reply(self, request_id: int, timeout: float = 15.0) -> dict[str, Any]:
        found = self._wait(lambda: self._replies.get(request_id), timeout, f"reply {request_id}")
        return dict(found)

    def try_call(self, op: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        return self.reply(self.send(op, **fields), timeout)

    def call(self, op: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        reply = self.try_call(op, timeout, **fields)
        if not reply["ok"]:
            raise NodeFailed(reply)
        return reply

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def entries(self) -> list[Entry]:
        return [decode(from_json(item)) for item in self.call("entries")["entries"]]

    def commits(self) -> list[int]:
        return list(self.call("entries")["commits"])

    def append(self, entry: Entry, timeout: float = 5.0) -> int:
        return int(self.call("append", entry=wire(entry), timeout=timeout)["index"])

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            self.popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        self.signal(signal.SIGKILL)
        self.popen.wait(10)
        self._release()

    def close(self) -> None:
        """Ask the node to close its log and exit; SIGKILL if it does not."""
        if self.alive:
            try:
                self.call("close", timeout=10)
                self.popen.wait(10)
            except (OSError, AssertionError, subprocess.TimeoutExpired):
                self.popen.kill()
                self.popen.wait(10)
        self._release()

    def _release(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._reader.join(5)


class RaftCluster:
    """The node processes of one test, by address."""

    def __init__(self, root: Path, password: str) -> None:
        self.root = root
        self.password = password
        self.nodes: dict[str, NodeProcess] = {}
        self.history: list[NodeProcess] = []

    def spawn(
        self,
        address: str | None = None,
        peers: Iterable[str] = (),
        *,
        password: str | None = None,
        wait: bool = True,
    ) -> NodeProcess:
        """Start a node (again: same address, same data dir) with `peers`."""
        address = address or f"127.0.0.1:{free_port()}"
        port = address.rsplit(":", 1)[1]
        node = NodeProcess(
            address,
            [peer for peer in peers if peer != address],
            self.password if password is None else password,
            self.root / f"data-{port}",
            self.root / f"{port}.log",
        )
        self.nodes[address] = node
        self.history.append(node)
        if wait:
            event = node.wait_started()
            assert event["event"] == "started", event
        return node

    def start(self, n: int) -> list[NodeProcess]:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        nodes = [self.spawn(address, addresses, wait=False) for address in addresses]
        for node in nodes:
            event = node.wait_started()
            assert event["event"] == "started", event
        return nodes

    @property
    def live(self) -> list[NodeProcess]:
        return [node for node in self.nodes.values() if node.alive]

    def wait_leader(
        self, among: Iterable[NodeProcess] | None = None, timeout: float = 10.0
    ) -> NodeProcess:
        """Poll until one node leads and every node in `among` (default: all live) is ready
        and names it; return the leader."""
        group = list(among) if among is not None else self.live

        def agreed() -> NodeProcess | None:
            statuses = [node.status() for node in group]
            leaders = {status["leader"] for status in statuses}
            if len(leaders) != 1 or None in leaders:
                return None
            if not all(status["is_ready"] for status in statuses):
                return None
            (leader,) = leaders
            node = self.nodes.get(leader)
            return node if node is not None and node.alive else None

        leader: NodeProcess = wait_for(agreed, timeout, "one agreed leader")
        return leader

    def wait_applied(self, count: int, among: Iterable[NodeProcess], timeout: float = 10.0) -> None:
        group = list(among)
        wait_for(
            lambda: all(node.status()["applied"] >= count for node in group),
            timeout,
            f"{count} entries applied on {[node.address for node in group]}",
        )

    def shutdown(self) -> None:
        for node in self.history:
            node.signal(signal.SIGCONT)
            node.kill()


@pytest.fixture
def raft_cluster(tmp_path: Path) -> Iterator[Callable[..., RaftCluster]]:
    """Factory: ``raft_cluster(n=3)`` starts an n-node group and returns it (not yet ready:
    call ``wait_leader()``)."""
    clusters: list[RaftCluster] = []

    def factory(n: int = 3, password: str = PASSWORD) -> RaftCluster:
        cluster = RaftCluster(tmp_path, password)
        clusters.append(cluster)
        cluster.start(n)
        return cluster

    yield factory
    for cluster in clusters:
        cluster.shutdown()
