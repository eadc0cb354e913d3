"""A coordination group shared by processes of different users through a share key.

Consumers run `share_consumer.py`, each as a user of its own when the tests run as root (as CI
does, and as a root host agent runs kernels); otherwise as this user, which still exercises the
key, the JSON wire and the tensor-only batches, but not the separation of users.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from kernelfleet.privileges import kernel_uid  # noqa: E402
from kernelfleet.tools.dataload import share  # noqa: E402
from kernelfleet.tools.dataload.coordinate import CoordinationError, coordinate  # noqa: E402
from kernelfleet.tools.dataload.coordinate_server import address  # noqa: E402
from kernelfleet.tools.dataload.coordinate_wire import (  # noqa: E402
    MAX_SHARED_FRAME,
    Channel,
    FrameReader,
    ProtocolError,
    encode,
)

CONSUMER = Path(__file__).with_name("share_consumer.py")
REPO = Path(__file__).resolve().parents[3]
AS_ROOT = os.geteuid() == 0
ITEMS, BATCH, EPOCHS = 24, 4, 2


def group_name() -> str:
    return f"test-share-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def log_dir() -> Iterator[Path]:
    """A folder every user may write (the consumers' users log their preparation in it)."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-share-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def user(name: str) -> dict[str, int]:
    """Popen's arguments to run as a user of its own (``name``'s kernel uid) when root."""
    if not AS_ROOT:
        return {}
    uid = kernel_uid(f"share-test-{name}")
    return {"user": uid, "group": uid, "extra_groups": []}


STARTED: list[subprocess.Popen[str]] = []
STDERR: dict[int, Path] = {}


@pytest.fixture(autouse=True)
def _stop_consumers() -> Iterator[None]:
    """Whatever a test leaves running (it failed midway) is killed."""
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()


def start(name: str, group: str, key: str, log_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """A consumer. Its standard error goes to a file: the coordinator and producer it may start
    inherit it, and a pipe would stay open as long as they run."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(log_dir)}
    stderr = log_dir / f"stderr-{name}-{len(STDERR)}.txt"
    with stderr.open("w") as errors:
        STARTED.append(subprocess.Popen(
            [sys.executable, str(CONSUMER), group, key, "2", str(log_dir), *extra],
            stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=log_dir,
            **user(name),  # type: ignore[arg-type]
        ))  # fmt: skip
    STDERR[STARTED[-1].pid] = stderr
    return STARTED[-1]


def wait_listening(group: str) -> None:
    """Until the shared group's coordinator listens (the connection is then left)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            connect_raw(group).close()
            return
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nobody listens for group {group}"
            time.sleep(0.05)


def line(process: subprocess.Popen[str]) -> dict[str, Any]:
    stdout: IO[str] | None = process.stdout
    assert stdout is not None
    text = stdout.readline()
    if not text:
        process.wait(30)
        errors = STDERR[process.pid].read_text()[-3000:]
        pytest.fail(f"consumer exited {process.returncode}: {errors}")
    result: dict[str, Any] = json.loads(text)
    return result


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    result = line(process)
    process.wait(60)
    return result


def reference_order() -> list[list[list[int]]]:
    """The labels the consumers' seeded loader gives when iterated alone, epoch by epoch."""
    loader = DataLoader(list(range(ITEMS)), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(11))  # fmt: skip
    return [[batch.tolist() for batch in loader] for _ in range(EPOCHS)]


def prepared(log_dir: Path) -> dict[str, list[int]]:
    return {log.name: [int(n) for n in log.read_text().split()] for log in log_dir.glob("*.log")}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_users_share_one_group_each_batch_prepared_once(log_dir: Path) -> None:
    group, key = group_name(), share.new_key()
    first = start("a", group, key, log_dir)
    second = start("b", group, key, log_dir)
    joined = [line(first), line(second)]
    stranger = connect_raw(group)  # connected, never proving: must not keep the group alive
    results = [finish(first), finish(second)]
    gone_within(15, joined[0]["coordinator_pid"], joined[0]["producer_pid"])
    stranger.close()

    assert results[0]["epochs"] == results[1]["epochs"] == reference_order()
    for result in results:
        assert (result["items_prepared"], result["batches_prepared"]) == (ITEMS * EPOCHS, 12)
    logs = prepared(log_dir)
    assert len(logs) == 1, f"prepared by one producer, of one user: {list(logs)}"
    (producer_log,) = logs.values()
    assert sorted(producer_log) == sorted(list(range(ITEMS)) * EPOCHS)
    assert joined[0]["producer_pid"] == joined[1]["producer_pid"]
    if AS_ROOT:
        assert joined[0]["uid"] != joined[1]["uid"]
        producer_uid = int(next(iter(logs)).removeprefix("getitem-").removesuffix(".log"))
        (guest,) = [j for j in joined if j["uid"] != producer_uid]
        # the other user's descriptors read, and do nothing else
        assert guest["rights"] == {
            "write": "Bad file descriptor",
            "reopen_rw": "Permission denied",
            "truncate": "Invalid argument",
        }


def gone_within(seconds: float, *pids: int) -> None:
    deadline = time.monotonic() + seconds
    while any(Path(f"/proc/{pid}").exists() and not zombie(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.05)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def connect_raw(group: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address(group, shared=True))
    return sock


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_the_key_nothing_of_the_group_is_reachable(log_dir: Path) -> None:
    """A wrong key is refused with a clear error; garbage and bad proofs are dropped; the slots
    have no names and the coordinator's descriptors are not another user's to open; and the
    group forms and runs as if none of that had happened."""
    group, key = group_name(), share.new_key()
    first = start("a", group, key, log_dir, "slow")
    wait_listening(group)
    wrong = start("c", group, share.new_key(), log_dir)
    assert line(wrong) == {
        "error": f"group {group} refused this share key: it is not the key the group was "
        "formed with"
    }
    wrong.wait(30)
    garbage = connect_raw(group)
    garbage.sendall(b"\xff\xff\xff\xff" + b"x" * 100)  # a frame larger than any message
    guesser = Channel(connect_raw(group), shared=True)
    challenge = guesser.receive(10)
    assert challenge[0] == "challenge"
    guesser.send(("prove", share.new_nonce(), "0" * 64))
    assert "refused this share key" in guesser.receive(10)[1]
    guesser.close()

    second = start("b", group, key, log_dir, "slow")
    joined = [line(first), line(second)]
    coordinator = joined[0]["coordinator_pid"]
    assert not [p for p in Path("/dev/shm").glob(f"*{group}*")], "slots have no names"
    if AS_ROOT:
        peek = subprocess.run(
            [sys.executable, "-c", f"import os; os.listdir('/proc/{coordinator}/fd')"],
            capture_output=True, text=True, **user("c"),  # type: ignore[arg-type]
        )  # fmt: skip
        assert "PermissionError" in peek.stderr
    os.kill(joined[0]["producer_pid"], signal.SIGKILL)  # and the group ends with an error
    for process in (first, second):
        assert finish(process) == {"error": f"producer of group {group} died (signal 9)"}
    garbage.settimeout(10)
    assert Channel(garbage, shared=True).receive(10)[0] == "challenge"
    assert garbage.recv(100) == b"", "the coordinator dropped it"


def test_a_squatter_on_the_address_is_found_out(tmp_path: Path) -> None:
    """A process that holds a shared group's name but not its key cannot pass for the group."""
    group, key = group_name(), share.new_key()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(group, shared=True))
    listener.listen(1)
    seen: list[Any] = []

    def squat() -> None:
        sock, _ = listener.accept()
        channel = Channel(sock, shared=True)
        channel.send(("challenge", share.new_nonce()))
        proof = channel.receive(10)
        seen.append(proof)
        channel.send(("proven", proof[2]))  # replays the consumer's own proof
        channel.close()

    thread = threading.Thread(target=squat)
    thread.start()
    loader = DataLoader(list(range(8)), batch_size=4)
    with pytest.raises(CoordinationError, match="did not prove it knows the share key"):
        coordinate(loader, group, consumers=2, share=key, timeout=10)
    thread.join(10)
    listener.close()
    assert key not in json.dumps(seen), "the key itself never travels"


def test_a_batch_the_format_cannot_carry_fails_the_group_naming_it() -> None:
    items = [{"x": i, "path": Path(f"/data/{i}")} for i in range(4)]
    loader = DataLoader(items, batch_size=2, collate_fn=list)
    group = group_name()
    with (
        coordinate(loader, group, consumers=1, share=share.new_key(), timeout=30) as batches,
        pytest.raises(CoordinationError) as failed,
    ):
        list(batches)
    assert f"producer of group {group} failed: TypeError: batch[0]['path']: a PosixPath" in str(
        failed.value
    )


@pytest.mark.parametrize("key", ["short", "x" * 300, "no spaces allowed in keys at all", 42])
def test_a_malformed_key_is_refused_before_anything_starts(key: Any) -> None:
    loader = DataLoader(list(range(8)), batch_size=4)
    with pytest.raises(ValueError, match="is not one: a key is 22 to 256"):
        coordinate(loader, group_name(), consumers=1, share=key)


def test_keys_and_proofs() -> None:
    key = share.new_key()
    assert share.check_key(key) == key
    assert len(key) == 36
    assert key.startswith("kfs_")
    assert key != share.new_key()
    a, b = share.new_nonce(), share.new_nonce()
    assert share.proven(key, share.proof(key, "consumer", a, b), "consumer", a, b)
    assert not share.proven(key, share.proof(key, "consumer", a, b), "coordinator", a, b)
    assert not share.proven(share.new_key(), share.proof(key, "consumer", a, b), "consumer", a, b)
    assert not share.proven(key, None, "consumer", a, b)
    assert share.is_nonce(a)
    assert not share.is_nonce("0" * 63)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ((MAX_SHARED_FRAME + 1).to_bytes(4, "big"), "a frame of 1048577 bytes"),
        (b"\x00\x00\x00\x03\x80\x04N", "not JSON"),
        (b"\x00\x00\x00\x02{}", "not a message"),
        (b"\x00\x00\x00\x02[]", "not a message"),
    ],
)
def test_a_shared_reader_refuses_what_is_not_a_json_message(frame: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        FrameReader(shared=True).feed(frame)


def test_a_shared_reader_reads_json_messages() -> None:
    stream = encode(("took", 3), shared=True) + encode(("join", {"a": 1}, 7), shared=True)
    assert FrameReader(shared=True).feed(stream) == [("took", 3), ("join", {"a": 1}, 7)]
