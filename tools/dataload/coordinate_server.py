"""The coordinator of one group: membership, the ring of slots, and the producer's life.

Run as ``python -m kernelfleet.tools.dataload.coordinate_server GROUP CONSUMERS TIMEOUT`` by the
first consumer of a group (`coordinate.coordinate`), the pickled loader on its standard input. It
binds the group's abstract unix socket (the election: a second coordinator's bind fails, it prints
``taken`` and exits), detaches (a double fork, so no consumer has to reap it), prints ``ready`` and
then serves until the group is over:

- it admits consumers of its own user until ``CONSUMERS`` joined, or fails them all after
  ``TIMEOUT`` seconds naming how many joined; a consumer whose loader differs is refused;
- it starts the producer (`coordinate_producer`) with the loader and the slot files, and hands it
  free slots; each batch the producer announces goes to every member, and its slot is freed when
  every member took it (or left, or skipped that epoch);
- it ends when the last member leaves, or when the producer fails or dies, after telling every
  member why. Whatever way it ends (SIGTERM included), the slot files are removed and the
  producer is stopped. Only a SIGKILL of the coordinator skips that; then the consumers remove
  the slot files, and the producer exits when it sees its control socket close.

A *shared* group (``... GROUP CONSUMERS TIMEOUT shared``, the share key on the first line of
standard input) admits consumers of any user who prove they know the key, and proves it knows it
in turn (`share`); its messages to and from them are JSON, never pickles. Its slots are unnamed
files (``O_TMPFILE`` in ``/dev/shm``, mode 0600): the producer writes them through its own
descriptors, and each consumer gets read-only descriptors with its welcome (``SCM_RIGHTS``), so
no other user can name, write or resize them, and nothing is left to clean up whatever way the
group ends.

It imports no torch: it moves opaque ``meta`` bytes, never tensors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.tools.dataload import share
from kernelfleet.tools.dataload.coordinate_wire import FrameReader, Message, ProtocolError, encode

log = logging.getLogger("kernelfleet.tools.dataload.coordinate")

SLOTS = 4
"""Batches a group holds at once: the producer runs at most this far ahead of the slowest member."""

STOP_GRACE_S = 5.0


def address(group: str, shared: bool = False) -> str:
    """The group's abstract unix socket address: freed by the kernel when its holder dies.

    A user's own groups are named by uid; a shared group by its name alone, so that a wrong key
    meets the group and is told so (and a rival holding the name is found out by its proof)."""
    if shared:
        return f"\0kernelfleet-coordinate-shared-{group}"
    return f"\0kernelfleet-coordinate-{os.getuid()}-{group}"


def _shm_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"


def slot_paths(group: str) -> list[str]:
    """The group's slot files, in ``/dev/shm`` (tmpfs) where it exists."""
    folder = _shm_folder()
    return [f"{folder}/kernelfleet-coordinate-{os.getuid()}-{group}-slot{i}" for i in range(SLOTS)]


def unnamed_slots() -> tuple[list[int], list[int]]:
    """A shared group's slots: unnamed files of this user only, as (read-write, read-only)
    descriptors. A read-only descriptor gives no way to write: the file has no name to open,
    and reopening ``/proc/self/fd/N`` for writing is refused to other users by its mode."""
    writable, readable = [], []
    for _ in range(SLOTS):
        fd = os.open(_shm_folder(), os.O_TMPFILE | os.O_RDWR, 0o600)
        writable.append(fd)
        readable.append(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
    return writable, readable


def remove_slots(group: str) -> None:
    """Removes the group's slot files; any of them may already be gone."""
    for path in slot_paths(group):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@dataclass(eq=False)
class Member:
    """One consumer's connection."""

    sock: socket.socket
    pid: int = 0
    joined: bool = False
    skipped_through: int = -1
    reader: FrameReader = field(default_factory=FrameReader)
    challenge: str = ""
    """Of a shared group: the nonce this member must prove the key over; empty once proven."""


@dataclass
class Pending:
    """A batch in a slot, and the members that have yet to take it."""

    slot: int
    epoch: int
    waiting: set[Member]


class Finished(Exception):
    """The group is over; the message (if any) goes to every member."""


class Coordinator:
    """Serves one group; `run` returns when the group is over."""

    def __init__(self, group: str, consumers: int, timeout: float, listener: socket.socket,
                 key: str | None = None) -> None:  # fmt: skip
        self.group = group
        self.key = key
        self.readable_slots: list[int] = []
        self.consumers = consumers
        self.timeout = timeout
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.members: list[Member] = []
        self.signature: Any = None
        self.started = False
        self.pending: dict[int, Pending] = {}
        self.epochs_requested = 0
        self.producer: subprocess.Popen[bytes] | None = None
        self.control: socket.socket | None = None
        self.control_reader = FrameReader()

    # -- life --------------------------------------------------------------------------------

    def start_producer(self, loader: bytes) -> None:
        """Creates the slot files and starts the producer with them and the loader."""
        if self.key is not None:
            fds, self.readable_slots = unnamed_slots()
        else:
            fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                   for p in slot_paths(self.group)]  # fmt: skip
        self.control, theirs = socket.socketpair()
        command = [sys.executable, "-m", "kernelfleet.tools.dataload.coordinate_producer",
                   str(theirs.fileno()), ",".join(map(str, fds))]  # fmt: skip
        if self.key is not None:
            command.append("shared")
        self.producer = subprocess.Popen(
            command, stdin=subprocess.PIPE, pass_fds=[*fds, theirs.fileno()]
        )
        theirs.close()
        for fd in fds:
            os.close(fd)
        assert self.producer.stdin is not None
        try:
            self.producer.stdin.write(loader)
            self.producer.stdin.close()
        except BrokenPipeError:
            pass  # it died at start: its socket closes and `on_producer_gone` says how
        for slot in range(SLOTS):
            self.to_producer(("free", slot))

    def run(self, loader: bytes) -> None:
        """Serves the group until it is over, then cleans up."""
        message: str | None = None
        try:
            self.start_producer(loader)
            self.serve()
        except Finished as finished:
            message = str(finished) or None
        except Exception as error:
            log.exception("group %s: the coordinator failed", self.group)
            message = f"the coordinator of group {self.group} failed: {error!r}"
        finally:
            if self.key is None:
                remove_slots(self.group)
            for fd in self.readable_slots:
                os.close(fd)
            self.readable_slots = []
            if message is not None:
                for member in list(self.members):
                    self.send(member, ("error", message))
            self.stop_producer()
            for member in self.members:
                member.sock.close()
            self.listener.close()

    def serve(self) -> None:
        assert self.control is not None
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(self.control, selectors.EVENT_READ, "producer")
        join_deadline = time.monotonic() + self.timeout
        while True:
            wait = None if self.started else max(0.0, join_deadline - time.monotonic())
            events = self.selector.select(wait)
            if not events and not self.started:
                joined = sum(m.joined for m in self.members)
                raise Finished(f"only {joined} of {self.consumers} consumers joined group "
                               f"{self.group} within {self.timeout:g} s")  # fmt: skip
            for key, _ in events:
                if key.data == "listener":
                    self.accept()
                elif key.data == "producer":
                    self.on_producer_data()
                elif key.data in self.members:  # not dropped by an earlier event of this batch
                    self.on_member_data(key.data)

    def stop_producer(self) -> None:
        if self.producer is None:
            return
        if self.producer.poll() is None:
            self.producer.terminate()
            try:
                self.producer.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.producer.kill()
                self.producer.wait()

    # -- members -----------------------------------------------------------------------------

    def accept(self) -> None:
        """Admits a connection: of this user, or in a shared group anyone, who must then prove
        the key before anything else it says counts."""
        sock, _ = self.listener.accept()
        if self.key is None:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                sock.close()
                return
            member = Member(sock)
        else:
            member = Member(sock, reader=FrameReader(shared=True), challenge=share.new_nonce())
        self.members.append(member)
        self.selector.register(sock, selectors.EVENT_READ, member)
        if member.challenge:
            self.send(member, ("challenge", member.challenge))

    def on_member_data(self, member: Member) -> None:
        try:
            data = member.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.leave(member)
            return
        try:
            messages = member.reader.feed(data)
        except ProtocolError as error:
            log.warning("group %s: dropping a consumer that sent %s", self.group, error)
            self.leave(member)
            return
        for message in messages:
            if member not in self.members:
                return
            if self.key is not None and not well_formed(message):
                log.warning("group %s: dropping a consumer that sent %.80r", self.group, message)
                self.leave(member)
                return
            if member.challenge:
                self.on_proof(member, message)
            else:
                self.on_member_message(member, message)

    def on_proof(self, member: Member, message: Message) -> None:
        """A shared group's first message from a member: its proof of the key, and ours."""
        assert self.key is not None
        if message[0] != "prove" or not share.proven(
            self.key, message[2], "consumer", member.challenge, message[1]
        ):
            self.refuse(member, f"group {self.group} refused this share key: it is not the key "
                        "the group was formed with")  # fmt: skip
            return
        ours = share.proof(self.key, "coordinator", message[1], member.challenge)
        member.challenge = ""
        self.send(member, ("proven", ours))

    def on_member_message(self, member: Member, message: Message) -> None:
        kind = message[0]
        if kind == "join":
            self.join(member, message[1], message[2])
        elif kind == "epoch":
            self.request_epoch(message[1])
        elif kind == "took":
            self.took(member, message[1])
        elif kind == "skip":
            member.skipped_through = max(member.skipped_through, message[1])
            for seq, pending in list(self.pending.items()):
                if pending.epoch <= message[1]:
                    self.took(member, seq)

    def join(self, member: Member, signature: dict[str, Any], pid: int) -> None:
        if self.started:
            self.refuse(member, f"group {self.group} already has its {self.consumers} consumers")
            return
        if self.signature is None:
            self.signature = signature
        elif signature != self.signature:
            differences = ", ".join(
                f"{key} {signature.get(key)!r} here, {self.signature.get(key)!r} in the group"
                for key in sorted(set(signature) | set(self.signature))
                if signature.get(key) != self.signature.get(key)
            )
            self.refuse(member, f"this loader differs from group {self.group}'s: {differences}")
            return
        member.pid = pid
        member.joined = True
        joined = [m for m in self.members if m.joined]
        for other in joined:
            self.send(other, ("joined", len(joined), self.consumers))
        if len(joined) == self.consumers:
            self.started = True
            assert self.producer is not None
            info: dict[str, Any] = {
                "producer_pid": self.producer.pid,
                "coordinator_pid": os.getpid(),
            }
            if self.key is None:
                info["slots"] = slot_paths(self.group)
            for other in joined:
                self.send(other, ("welcome", info), self.readable_slots)

    def refuse(self, member: Member, text: str) -> None:
        self.send(member, ("error", text))
        self.leave(member)

    def leave(self, member: Member) -> None:
        """Drops a member: batches stop waiting for it; the group ends with its last member (a
        connection that never joined, such as a stranger's to a shared group, does not count)."""
        if member not in self.members:
            return
        self.members.remove(member)
        self.selector.unregister(member.sock)
        member.sock.close()
        for seq in list(self.pending):
            self.took(member, seq)
        if self.started and not any(m.joined for m in self.members):
            raise Finished()

    def send(self, member: Member, message: Message, fds: list[int] | None = None) -> None:
        """Sends to a member (with ``fds``, in a shared group); one that does not read within the
        timeout is dropped."""
        try:
            member.sock.settimeout(self.timeout)
            frame = encode(message, shared=self.key is not None)
            if fds:
                sent = socket.send_fds(member.sock, [frame], fds)
                member.sock.sendall(frame[sent:])
            else:
                member.sock.sendall(frame)
        except OSError:
            log.warning(
                "group %s: dropping consumer pid %s, which stopped reading", self.group, member.pid
            )
            if message[0] != "error":
                self.leave(member)

    # -- the ring ----------------------------------------------------------------------------

    def request_epoch(self, epoch: int) -> None:
        assert self.control is not None
        while self.epochs_requested <= epoch:
            self.to_producer(("epoch", self.epochs_requested))
            self.epochs_requested += 1

    def took(self, member: Member, seq: int) -> None:
        pending = self.pending.get(seq)
        if pending is None:
            return
        pending.waiting.discard(member)
        if not pending.waiting:
            del self.pending[seq]
            assert self.control is not None
            self.to_producer(("free", pending.slot))

    def to_producer(self, message: Message) -> None:
        assert self.control is not None
        try:
            self.control.sendall(encode(message))
        except OSError:
            self.on_producer_gone()

    def on_producer_data(self) -> None:
        assert self.control is not None
        try:
            data = self.control.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.on_producer_gone()
        for message in self.control_reader.feed(data):
            kind = message[0]
            if kind == "batch":
                seq, epoch, slot = message[1], message[2], message[4]
                takers = {m for m in self.members if m.joined and m.skipped_through < epoch}
                if not takers:
                    self.to_producer(("free", slot))
                    continue
                self.pending[seq] = Pending(slot, epoch, takers)
                for member in list(takers):  # a member that stops reading leaves the set
                    self.send(member, message)
            elif kind == "end":
                for member in [m for m in self.members if m.skipped_through < message[1]]:
                    self.send(member, message)
            elif kind == "error":
                raise Finished(f"producer of group {self.group} failed: {message[1]}")

    def on_producer_gone(self) -> None:
        assert self.producer is not None
        try:
            code = self.producer.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            raise Finished(f"producer of group {self.group} closed its socket") from None
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise Finished(f"producer of group {self.group} died ({how})")


def well_formed(message: Message) -> bool:
    """Whether a shared group's member sent a message the coordinator can act on: its kind and
    the types of its arguments (a member runs as another user, and may send anything)."""
    kind, args = message[0], message[1:]
    if kind == "prove":
        return len(args) == 2 and share.is_nonce(args[0]) and isinstance(args[1], str)
    if kind == "join":
        return (
            len(args) == 2
            and isinstance(args[0], dict)
            and len(args[0]) <= 16
            and all(isinstance(v, (int, str, bool, type(None))) for v in args[0].values())
            and _is_int(args[1])
        )
    if kind in ("epoch", "took", "skip"):
        return len(args) == 1 and _is_int(args[0]) and 0 <= args[0] < 2**62
    return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _detach() -> None:
    """Double fork: the caller's parent returns at once and never has to reap us."""
    if os.fork():
        os._exit(0)
    os.setsid()


def main(argv: list[str]) -> int:
    group, consumers, timeout = argv[0], int(argv[1]), float(argv[2])
    shared = argv[3:] == ["shared"]
    key = sys.stdin.buffer.readline().decode().strip() if shared else None
    loader = sys.stdin.buffer.read()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(group, shared))
    except OSError:
        print("taken", flush=True)
        return 0
    listener.listen(64)
    _detach()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    Coordinator(group, consumers, timeout, listener, key).run(loader)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
