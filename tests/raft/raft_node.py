"""A `KernelLog` in its own process, driven over stdin/stdout by the tests (a fault double).

Run as ``python raft_node.py --address 127.0.0.1:PORT --peers A,B --password PW --data-dir D``.
It prints ``{"event": "started"}`` (or ``{"event": "error", ...}`` and exits 2), then answers
JSON-line requests ``{"id": N, "op": OP, ...}`` with ``{"id": N, "ok": true, ...}`` or
``{"id": N, "ok": false, "reason": ..., "message": ...}``. Requests run concurrently, so a
status query answers while an append is in flight. Entries travel as wire tuples in JSON,
bytes as ``{"$b": base64}`` (`to_json` / `from_json`, shared with the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kernelfleet.errors import FleetError
from kernelfleet.raft.config import LogConfig
from kernelfleet.raft.entries import Proposal, Role, decode, wire_size
from kernelfleet.raft.log import KernelLog


def to_json(value: Any) -> Any:
    """Wire data → JSON-able data (bytes become ``{"$b": base64}``)."""
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


def from_json(value: Any) -> Any:
    """The inverse of `to_json` (lists stay lists; `decode` accepts them)."""
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return base64.b64decode(value["$b"])
        return {key: from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json(item) for item in value]
    return value


def percentiles(samples: list[float]) -> dict[str, float]:
    # imported here, not at the top: the test-support package slows every node's start-up
    from kernelfleet.testing.stats import percentile

    return {
        "n": len(samples),
        "p50": statistics.median(samples),
        "p99": percentile(samples, 99),
        "max": max(samples),
    }


class Node:
    """Owns the log and answers requests (loop thread)."""

    def __init__(self, log_args: dict[str, Any]) -> None:
        self.commits: list[int] = []
        loop = asyncio.get_running_loop()
        self.log = KernelLog(loop=loop, on_commit=self.on_commit, **log_args)

    def on_commit(self, index: int, entry: Any) -> None:
        self.commits.append(index)

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.pop("op")
        return await getattr(self, f"op_{op}")(**request)

    async def op_status(self) -> dict[str, Any]:
        log = self.log
        return {
            "address": log.address,
            "leader": log.leader,
            "is_leader": log.is_leader,
            "is_ready": log.is_ready,
            "term": log.term,
            "applied": log.applied_count,
            "members": list(log.members),
            "raft_log_size": log.getStatus()["log_len"],
            "raft_commit_index": log.raftCommitIndex,
        }

    async def op_append(self, entry: Any, timeout: float = 5.0) -> dict[str, Any]:
        return {"index": await self.log.append(decode(from_json(entry)), timeout=timeout)}

    async def op_append_retry(self, entry: Any, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        return {"index": await self.log.append_with_retry(decode(from_json(entry)), deadline)}

    async def op_append_many(self, entries: list[Any], timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        indices = []
        for wire in entries:
            indices.append(await self.log.append_with_retry(decode(from_json(wire)), deadline))
        return {"indices": indices}

    async def op_entries(self, start: int = 0) -> dict[str, Any]:
        return {
            "entries": [to_json(entry.to_wire()) for entry in self.log.entries_from(start)],
            "commits": self.commits,
        }

    async def op_add_member(self, address: str, timeout: float = 5.0) -> dict[str, Any]:
        await self.log.add_member(address, timeout=timeout)
        return {"members": list(self.log.members)}

    async def op_remove_member(self, address: str, timeout: float = 5.0) -> dict[str, Any]:
        await self.log.remove_member(address, timeout=timeout)
        return {"members": list(self.log.members)}

    async def op_take_leadership(self, timeout: float = 1.0) -> dict[str, Any]:
        return {"agreed": await self.log.take_leadership(timeout=timeout)}

    async def op_compact(self) -> dict[str, Any]:
        self.log.forceLogCompaction()
        return {}

    async def op_bench(self, n: int, size: int, mode: str) -> dict[str, Any]:
        """Sequential commit latencies (ms) of `size`-byte entries: ``async`` through
        `KernelLog.append`, ``raw`` through pysyncobj's callback on a plain thread."""
        pad = 1
        while wire_size(Proposal("c" * pad, "r", Role.LEAD).to_wire()) < size:
            pad += 1
        entry = Proposal("c" * pad, "r", Role.LEAD)
        samples: list[float] = []
        if mode == "async":
            for _ in range(n):
                started = time.perf_counter()
                await self.log.append(entry, timeout=5.0)
                samples.append((time.perf_counter() - started) * 1000)
        else:
            wire = entry.to_wire()
            store = self.log._store

            def run() -> None:
                done = threading.Event()
                for _ in range(n):
                    done.clear()
                    started = time.perf_counter()
                    store.append(wire, callback=lambda result, error: done.set())
                    if not done.wait(5.0):
                        raise TimeoutError("raw append did not complete")
                    samples.append((time.perf_counter() - started) * 1000)

            await asyncio.get_running_loop().run_in_executor(None, run)
        return {"size": wire_size(entry.to_wire()), **percentiles(samples)}

    async def op_close(self) -> dict[str, Any]:
        await self.log.close()
        return {}


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def serve(node: Node) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(request: dict[str, Any]) -> None:
        request_id = request.pop("id")
        try:
            reply = {"ok": True, **await node.handle(request)}
        except FleetError as error:
            reply = {"ok": False, "reason": error.reason, "message": str(error)}
            reply["error"] = type(error).__name__
        except Exception as error:
            reply = {"ok": False, "reason": "exception", "message": repr(error)}
            reply["error"] = type(error).__name__
        emit({"id": request_id, **reply})

    while line := await reader.readline():
        request = json.loads(line)
        closing = request.get("op") == "close"
        task = asyncio.create_task(answer(request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if closing:
            await task
            return
    await node.log.close()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--peers", default="")
    parser.add_argument("--password", required=True)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    try:
        node = Node(
            {
                "self_address": args.address,
                "peers": [peer for peer in args.peers.split(",") if peer],
                "password": args.password,
                "data_dir": Path(args.data_dir),
                "config": LogConfig(),
            }
        )
    except Exception as error:
        emit({"event": "error", "error": type(error).__name__, "message": str(error)})
        return 2
    emit({"event": "started", "address": args.address})
    await serve(node)
    return 0


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    sys.exit(asyncio.run(main()))
