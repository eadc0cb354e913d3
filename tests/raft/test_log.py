"""`KernelLog` in this process: the async API, delivery, recovery and failure modes.

A node with no peers is a one-node group that elects itself; nodes whose peers do not exist
never find a leader. Multi-process groups are in test_cluster.py.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.raft.config import LogConfig
from kernelfleet.raft.entries import Entry, Proposal, Role, StateDelta, UnknownEntry
from kernelfleet.raft.errors import (
    BindFailed,
    EntryTooLarge,
    FailReason,
    LogClosed,
    NotCommitted,
    NotReady,
)
from kernelfleet.raft.log import KernelLog, Lifecycle

from .conftest import PASSWORD, free_port

pytestmark = pytest.mark.timeout(30)


def open_log(
    data_dir: Path,
    address: str,
    peers: list[str] | None = None,
    on_commit: Callable[[int, Any], None] | None = None,
    **config: Any,
) -> KernelLog:
    return KernelLog(
        address,
        peers or [],
        password=PASSWORD,
        data_dir=data_dir,
        loop=asyncio.get_running_loop(),
        on_commit=on_commit or (lambda index, entry: None),
        config=LogConfig(**config),
    )


def cells(n: int, tag: str = "c") -> list[Entry]:
    return [Proposal(f"{tag}{i}", "r0", Role.LEAD) for i in range(n)]


@pytest.fixture
def idle_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_a_password_is_required(tmp_path, idle_loop):
    for password in ("", None):
        with pytest.raises(ValueError, match="password"):
            KernelLog(
                f"127.0.0.1:{free_port()}",
                [],
                password=password,
                data_dir=tmp_path,
                loop=idle_loop,
                on_commit=lambda index, entry: None,
            )


@pytest.mark.parametrize("address", ["0.0.0.0:7000", ":7000", "127.0.0.1", "host:0", "h:x"])
def test_addresses_must_be_concrete(tmp_path, idle_loop, address):
    with pytest.raises(ValueError, match="host:port"):
        KernelLog(
            address,
            [],
            password=PASSWORD,
            data_dir=tmp_path,
            loop=idle_loop,
            on_commit=lambda index, entry: None,
        )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"heartbeat": 0.1}, "heartbeat"),
        ({"min_timeout": 0.5, "max_timeout": 0.5}, "max_timeout"),
        ({"connection_timeout": 0.3}, "connection_timeout"),
        ({"max_entry_bytes": 10}, "max_entry_bytes"),
        ({"bind_attempts": 0}, "bind_attempts"),
    ],
)
def test_config_invariants_are_checked(config, message):
    with pytest.raises(ValueError, match=message):
        LogConfig(**config)


async def test_append_commits_and_on_commit_runs_first_in_order(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    seen: list[tuple[int, Any]] = []
    log = open_log(tmp_path, address, on_commit=lambda i, e: seen.append((i, e)))
    try:
        await log.wait_ready(5)
        assert log.leader == address
        assert log.is_leader
        assert log.members == (address,)
        for i, entry in enumerate(cells(5)):
            assert await log.append(entry) == i
            assert seen[-1] == (i, entry)  # on_commit ran before append returned
        assert [index for index, _ in seen] == [0, 1, 2, 3, 4]
        assert log.entries_from(3) == cells(5)[3:]
        assert log.applied_count == 5
        with pytest.raises(ValueError, match="index"):
            log.entries_from(-1)
    finally:
        await log.close()
    assert log.lifecycle is Lifecycle.CLOSED
    with pytest.raises(LogClosed):
        await log.append(cells(1)[0])
    await log.close()  # idempotent
    # the port is released
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", int(address.rsplit(":", 1)[1])))


async def test_reopened_log_replays_its_journal_once_in_order(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    log = open_log(tmp_path, address)
    await log.wait_ready(5)
    for entry in cells(6):
        await log.append(entry)
    await log.close()

    seen: list[int] = []
    log = open_log(tmp_path, address, on_commit=lambda i, e: seen.append(i))
    try:
        await log.wait_ready(5)
        assert seen == [0, 1, 2, 3, 4, 5]  # ready means on_commit saw the recovered log
        assert log.entries_from() == cells(6)
        assert await log.append(Proposal("next", "r0", Role.YIELD)) == 6
        assert seen == list(range(7))
    finally:
        await log.close()


async def test_journal_with_a_removed_entry_kind_replays_with_every_index(tmp_path):
    """A journal written while "vote" was an entry kind (since removed) still replays."""
    address = f"127.0.0.1:{free_port()}"
    vote = ("vote", 1, {"cell_id": "c0", "replica_id": "r1", "winner": "r0", "attempt": 0})
    delta = StateDelta("c0", "r0", execution_count=1)
    log = open_log(tmp_path, address)
    await log.wait_ready(5)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    await log.append(cells(1)[0])
    log._store.append(  # as the code before the removal wrote it
        vote, callback=lambda result, error: loop.call_soon_threadsafe(future.set_result, result)
    )
    assert await asyncio.wait_for(future, 5) == 1
    await log.append(delta)
    await log.close()

    log = open_log(tmp_path, address)
    try:
        await log.wait_ready(5)
        first, old, last = log.entries_from()
        assert first == cells(1)[0]
        assert isinstance(old, UnknownEntry)
        assert old.wire == vote
        assert last == delta
        assert await log.append(Proposal("c1", "r0", Role.LEAD)) == 3
    finally:
        await log.close()


async def test_oversized_entry_never_reaches_pysyncobj(tmp_path):
    log = open_log(tmp_path, f"127.0.0.1:{free_port()}", max_entry_bytes=64 * 1024)
    submitted: list[Any] = []
    original = log._applyCommand

    def spy(*args: Any, **kwargs: Any) -> Any:
        submitted.append(args)
        return original(*args, **kwargs)

    log._applyCommand = spy
    try:
        await log.wait_ready(5)
        big = StateDelta("c", "r0", changed={"model": b"w" * 70_000})
        with pytest.raises(EntryTooLarge, match="object store"):
            await log.append(big)
        with pytest.raises(EntryTooLarge):
            await log.append_with_retry(big, time.monotonic() + 5)
        assert submitted == []
        assert log.applied_count == 0
        await log.append(StateDelta("c", "r0", pointers={"model": "store/key"}))
        assert len(submitted) == 1
    finally:
        await log.close()


async def test_without_a_leader_appends_fail_fast_and_retries_give_up(tmp_path):
    peers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    log = open_log(tmp_path, f"127.0.0.1:{free_port()}", peers)
    try:
        with pytest.raises(NotReady):
            await log.wait_ready(0.3)
        with pytest.raises(NotCommitted) as failure:
            await log.append(cells(1)[0])
        assert failure.value.fail_reason is FailReason.MISSING_LEADER
        assert failure.value.reason == "missing-leader"
        assert failure.value.retryable

        started = time.monotonic()
        with pytest.raises(NotCommitted) as failure:
            await log.append_with_retry(cells(1)[0], started + 0.4)
        assert 0.3 < time.monotonic() - started < 2.0
        assert failure.value.fail_reason is FailReason.MISSING_LEADER
    finally:
        await log.close()


async def test_queued_append_times_out_and_close_fails_calls_in_flight(tmp_path):
    peers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    log = open_log(tmp_path, f"127.0.0.1:{free_port()}", peers, commands_wait_leader=True)
    try:
        with pytest.raises(NotCommitted) as failure:
            await log.append(cells(1)[0], timeout=0.2)
        assert failure.value.fail_reason is FailReason.TIMEOUT
        assert "may still commit" in failure.value.message

        in_flight = asyncio.create_task(log.append(cells(1)[0], timeout=10))
        await asyncio.sleep(0)  # the task submits and waits on its future
    finally:
        await log.close()
    with pytest.raises(LogClosed):
        await in_flight


async def test_a_failing_on_commit_does_not_stop_delivery(tmp_path, caplog):
    seen: list[int] = []

    def on_commit(index: int, entry: Any) -> None:
        seen.append(index)
        if index == 0:
            raise RuntimeError("consumer bug")

    log = open_log(tmp_path, f"127.0.0.1:{free_port()}", on_commit=on_commit)
    try:
        await log.wait_ready(5)
        with caplog.at_level(logging.ERROR, logger="kernelfleet.raft.log"):
            await log.append(cells(1)[0])
            await log.append(cells(2)[1])
        assert seen == [0, 1]
        assert "on_commit raised for entry 0" in caplog.text
    finally:
        await log.close()


async def test_undecodable_entries_keep_their_index(tmp_path):
    seen: list[Any] = []
    log = open_log(tmp_path, f"127.0.0.1:{free_port()}", on_commit=lambda i, e: seen.append(e))
    try:
        await log.wait_ready(5)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()
        log._store.append(
            ("proposal", 99, {}),  # a newer format, as a newer replica would write
            callback=lambda result, error: loop.call_soon_threadsafe(future.set_result, result),
        )
        assert await asyncio.wait_for(future, 5) == 0
        assert await log.append(cells(1)[0]) == 1
        assert isinstance(seen[0], UnknownEntry)
        assert seen[1] == cells(1)[0]
    finally:
        await log.close()


async def test_port_in_use_fails_construction(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(BindFailed, match=str(port)):
            open_log(tmp_path, f"127.0.0.1:{port}")


async def test_calls_from_another_loop_are_refused(tmp_path):
    log = open_log(tmp_path, f"127.0.0.1:{free_port()}")
    try:
        await log.wait_ready(5)

        def elsewhere() -> None:
            asyncio.run(log.append(cells(1)[0]))

        with pytest.raises(RuntimeError, match="loop given"):
            await asyncio.get_running_loop().run_in_executor(None, elsewhere)
    finally:
        await log.close()


async def test_port_in_use_after_several_bind_attempts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(BindFailed):
            open_log(tmp_path, f"127.0.0.1:{port}", bind_attempts=3)
        assert time.monotonic() - started < 3.0


async def test_reopened_log_recovers_from_its_full_dump(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    log = open_log(tmp_path, address, use_fork=False)
    await log.wait_ready(5)
    for entry in cells(8):
        await log.append(entry)
    log_len = log.getStatus()["log_len"]
    log.forceLogCompaction()
    deadline = time.monotonic() + 5
    while log.getStatus()["log_len"] >= log_len:  # the journal is trimmed once dumped
        assert time.monotonic() < deadline, "no full dump"
        await asyncio.sleep(0.01)
    await log.append(Proposal("after-dump", "r0", Role.YIELD))
    await log.close()
    # the dump holds the replicated list and nothing local (loop, callbacks, counters)
    with gzip.open(tmp_path / "raft.dump") as dump:
        own_state, store_state = pickle.load(dump)[0]
    assert [key for key in own_state if not key.startswith("_SyncObj__")] == []
    assert set(store_state) == {"entries"}
    assert len(store_state["entries"]) == 8

    seen: list[tuple[int, Any]] = []
    log = open_log(tmp_path, address, on_commit=lambda i, e: seen.append((i, e)))
    try:
        await log.wait_ready(5)
        expected = [*cells(8), Proposal("after-dump", "r0", Role.YIELD)]
        assert seen == list(enumerate(expected))
        assert await log.append(Proposal("next", "r0", Role.LEAD)) == 9
    finally:
        await log.close()


def test_pysyncobj_is_tuned_for_latency_and_secured(tmp_path):
    """pysyncobj's batching waits for a 0.1 s tick per commit (p50 ~100 ms): it must stay off."""
    from kernelfleet.raft.config import LogConfig

    conf = LogConfig().syncobj_conf(
        address="127.0.0.1:1",
        password="secret",
        data_dir=tmp_path,
        on_ready=lambda: None,
        on_state_changed=lambda old, new: None,
    )
    assert conf.appendEntriesUseBatch is False
    assert conf.dynamicMembershipChange is True
    assert conf.password == "secret"
    assert conf.bindAddress == "127.0.0.1:1"
    assert conf.journalFile is not None
    assert conf.fullDumpFile is not None
