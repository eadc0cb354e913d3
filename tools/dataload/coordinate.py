"""Coordinated data preparation (CoorDL, VLDB'21): one producer prepares each batch for k consumers.

::

    from kernelfleet.tools.dataload.coordinate import coordinate

    # in each of k kernels (or processes) on one host, with an equal loader:
    loader = coordinate(DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                                   generator=torch.Generator().manual_seed(0)),
                        "search-1", consumers=k)
    for epoch in range(epochs):
        for images, labels in loader:      # the same batches, in the same order, in every kernel
            ...

The first of the ``k`` to call `coordinate` starts the group's coordinator (`coordinate_server`),
which starts one producer (`coordinate_producer`) with that caller's loader. The producer
iterates the loader (its workers fetch, decode and collate) once per epoch and writes each batch
into a slot of shared memory (`coordinate_batches`); every consumer copies it out, and the slot is
reused once all took it. So each sample is prepared once per epoch for the whole group instead of
k times, and every consumer sees the producer's order. Everyone waits with a deadline: nothing
here hangs on a dead or missing peer.

- `coordinate` returns once all ``k`` joined (or raises `CoordinationError` naming how many did);
- each ``iter()`` is one epoch; a consumer that abandons an epoch (``break``) skips its rest;
- a consumer that closes (or whose process ends) leaves: the others go on without it. One that
  stays but stops taking batches holds the ring: the others' waits end after ``timeout`` with an
  error;
- if the producer fails or dies, every consumer's next batch raises `CoordinationError` with the
  producer's error or its signal, and the group's shared memory is removed.

A group is a user's own unless it is formed with a share key (``share=KEY``, see `share`): then
kernels of other users (per-kernel users, docs/security.md) who pass the same key join it. The
key is proven, never sent, both ways; batches reach them in `tensor_format` through read-only
descriptors, and nothing of theirs is ever unpickled by another user's process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import cloudpickle
from torch.utils.data import DataLoader, IterableDataset

import kernelfleet
from kernelfleet.tools.dataload import coordinate_server as server
from kernelfleet.tools.dataload import share as share_keys
from kernelfleet.tools.dataload.coordinate_batches import read_all, read_batch
from kernelfleet.tools.dataload.coordinate_wire import (
    Channel,
    ConnectionClosed,
    Message,
    ProtocolError,
)
from kernelfleet.tools.dataload.tensor_format import TensorFormatError, decode

GROUP_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_GROUP_LENGTH = 64
JOIN_GRACE_S = 5.0
LAST_WORD_S = 1.0


class CoordinationError(RuntimeError):
    """The group cannot go on (or never formed); the text says why."""


@dataclass(frozen=True)
class CoordinationStats:
    """What a `CoordinatedLoader` has seen so far.

    ``batches_prepared`` and ``items_prepared`` are the producer's, for the whole group, as of
    the last batch this consumer received (``items_prepared`` counts the dataset's ``__getitem__``
    calls, workers included; mid-epoch it may count items prefetched for later batches, at the
    end of an epoch it is exact). ``batches_consumed`` and ``wait_s`` (time spent waiting for the
    producer) are this consumer's.
    """

    batches_prepared: int = 0
    items_prepared: int = 0
    batches_consumed: int = 0
    epochs_completed: int = 0
    wait_s: float = 0.0


def loader_signature(loader: DataLoader[Any]) -> dict[str, Any]:
    """What must be equal between the loaders of one group."""
    return {
        "dataset_length": len(loader.dataset),  # type: ignore[arg-type]
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "batches": len(loader),
        "sampler": type(loader.sampler).__name__,
        "seed": None if loader.generator is None else loader.generator.initial_seed(),
    }


def _check(loader: Any, group: str, consumers: int, timeout: float, key: str | None) -> None:
    if not isinstance(loader, DataLoader):
        raise TypeError(f"coordinate needs a torch DataLoader, not {type(loader).__name__}")
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
            "coordinate needs a map-style dataset (an IterableDataset has no shared order)"
        )
    if not group or len(group) > MAX_GROUP_LENGTH or not set(group) <= GROUP_CHARACTERS:
        raise ValueError(
            f"group {group!r}: 1 to {MAX_GROUP_LENGTH} letters, digits, '_', '.' or '-'"
        )
    if consumers < 1:
        raise ValueError(f"consumers must be at least 1, not {consumers}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout}")
    if key is not None:
        share_keys.check_key(key)


def _child_environment() -> dict[str, str]:
    """Our environment, with this kernelfleet first on the path so the children import it."""
    root = str(Path(kernelfleet.__file__).parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _connect(group: str, shared: bool) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(server.address(group, shared))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    return sock


_BY_VALUE_LOCK = threading.Lock()


def _pickle(loader: DataLoader[Any]) -> bytes:
    """The loader for the producer: cloudpickle sends what a notebook (``__main__``) defined by
    value; so here is what the main script of a spawned process (``__mp_main__``) defined, which
    the producer could not import by that name."""
    spawned_main = sys.modules.get("__mp_main__")
    with _BY_VALUE_LOCK:  # the registration is process-wide: one thread at a time
        if spawned_main is not None:
            cloudpickle.register_pickle_by_value(spawned_main)
        try:
            return cloudpickle.dumps(loader)
        except Exception as error:
            raise TypeError(f"this loader cannot be sent to the producer: {error}") from error
        finally:
            if spawned_main is not None:
                cloudpickle.unregister_pickle_by_value(spawned_main)


def _start_coordinator(
    loader: DataLoader[Any], group: str, consumers: int, timeout: float, key: str | None
) -> None:
    """Starts the group's coordinator; returns once it (or a rival) listens. The key goes on its
    standard input (a command line is readable by every user of the host)."""
    payload = _pickle(loader)
    command = [sys.executable, "-m", "kernelfleet.tools.dataload.coordinate_server", group,
               str(consumers), repr(timeout)]  # fmt: skip
    if key is not None:
        command.append("shared")
        payload = key.encode() + b"\n" + payload
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_environment()
    )
    try:
        out, _ = process.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise CoordinationError(
            f"the coordinator of group {group} did not start within {timeout:g} s"
        ) from None
    if out.strip() not in (b"ready", b"taken"):
        raise CoordinationError(
            f"the coordinator of group {group} failed to start (exit code {process.returncode})"
        )


def _rendezvous(
    loader: DataLoader[Any], group: str, consumers: int, timeout: float, key: str | None
) -> socket.socket:
    """A connection to the group's coordinator, started here if there is none."""
    deadline = time.monotonic() + timeout
    started = False
    while True:
        sock = _connect(group, key is not None)
        if sock is not None:
            return sock
        if not started:
            _start_coordinator(loader, group, consumers, timeout, key)
            started = True
        elif time.monotonic() > deadline:
            raise CoordinationError(f"cannot reach the coordinator of group {group}")
        else:
            time.sleep(0.01)  # a rival coordinator has bound the address and is about to listen


def _prove(channel: Channel, group: str, key: str, timeout: float) -> None:
    """The shared group's handshake: we prove we know ``key``, then check that the process we
    reached proves it too (else it is not the group's coordinator: a rival holding the name)."""
    impostor = (
        f"the process holding group {group}'s address did not prove it knows the share key: "
        "it is not the coordinator of a group formed with this key"
    )
    try:
        challenge = channel.receive(timeout)
        if challenge[0] == "error" and len(challenge) == 2:
            raise CoordinationError(str(challenge[1]))
        if challenge[0] != "challenge" or not share_keys.is_nonce(challenge[1]):
            raise CoordinationError(impostor)
        ours = share_keys.new_nonce()
        channel.send(
            ("prove", ours, share_keys.proof(key, "consumer", challenge[1], ours)), timeout
        )
        answer = channel.receive(timeout)
    except (ConnectionClosed, ProtocolError, TimeoutError, IndexError, OSError) as error:
        channel.close()
        raise CoordinationError(f"{impostor} ({error})") from None
    except CoordinationError:
        channel.close()
        raise
    if answer[0] == "error" and len(answer) == 2:
        channel.close()
        raise CoordinationError(str(answer[1]))
    if not (
        answer[0] == "proven"
        and len(answer) == 2
        and share_keys.proven(key, answer[1], "coordinator", ours, challenge[1])
    ):
        channel.close()
        raise CoordinationError(impostor)


def coordinate(
    loader: DataLoader[Any],
    group: str,
    *,
    consumers: int,
    timeout: float = 60.0,
    share: str | None = None,
) -> CoordinatedLoader:
    """Joins (or forms) the group ``group`` of ``consumers`` processes sharing ``loader``'s batches.

    Every member passes an equal loader: the same dataset length, batch size, ``drop_last``,
    sampler type and generator seed (checked: a differing loader is refused with the
    differences). The group's producer iterates the loader of the member that came first.
    Blocks until all ``consumers`` joined; raises `CoordinationError` if they do not within
    ``timeout`` seconds, which also bounds every later wait for a batch.

    ``share``: a share key (`share.new_key`): the group admits processes of any user of the host
    that pass the same key, and only those; a wrong key is refused by the group. Its batches
    must then hold only what `tensor_format` carries. Without it, the group is this user's.
    """
    _check(loader, group, consumers, timeout, share)
    channel = Channel(_rendezvous(loader, group, consumers, timeout, share), shared=bool(share))
    if share is not None:
        _prove(channel, group, share, timeout)
    channel.send(("join", loader_signature(loader), os.getpid()), timeout)
    # The coordinator's own deadline comes first and its verdict follows its clean-up; ours is
    # the fallback for a coordinator that hangs.
    deadline = time.monotonic() + timeout + JOIN_GRACE_S
    joined = 0
    while True:
        try:
            message = channel.receive(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            channel.close()
            raise CoordinationError(f"only {joined} of {consumers} consumers joined group {group} "
                                    f"within {timeout:g} s") from None  # fmt: skip
        except ConnectionClosed:
            channel.close()
            raise CoordinationError(
                f"the coordinator of group {group} went away before it formed"
            ) from None
        except ProtocolError as error:
            channel.close()
            raise CoordinationError(f"the coordinator of group {group} sent {error}") from None
        if message[0] == "joined":
            joined = message[1]
        elif message[0] == "error":
            channel.close()
            raise CoordinationError(message[1])
        elif message[0] == "welcome":
            return CoordinatedLoader(channel, group, consumers, len(loader), timeout, message[1])


def _close(channel: Channel, fds: list[int]) -> None:
    channel.close()
    for fd in fds:
        os.close(fd)


def _open_slots(group: str, paths: list[str]) -> list[int]:
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY))
    except OSError as error:
        for fd in fds:
            os.close(fd)
        raise CoordinationError(f"group {group} ended as it formed: {error}") from error
    return fds


def _shared_slots(channel: Channel, group: str, info: Any) -> list[int]:
    """The read-only slot descriptors that came with a shared group's welcome."""
    fds, channel.fds = channel.fds, []
    if len(fds) != server.SLOTS or not (
        isinstance(info, dict)
        and all(isinstance(info.get(k), int) for k in ("producer_pid", "coordinator_pid"))
    ):
        for fd in fds:
            os.close(fd)
        raise CoordinationError(f"the coordinator of group {group} sent a malformed welcome "
                                f"({len(fds)} slots)")  # fmt: skip
    return fds


def _consumer_message(message: Message) -> bool:
    """Whether a shared group's coordinator sent a message of a shape a consumer acts on."""
    shapes = {"batch": 7, "end": 4, "error": 2}
    kind = message[0]
    if shapes.get(kind) != len(message):
        return False
    if kind == "error":
        return True
    prepared = message[-1]
    numbers = (
        [*message[1 : 3 if kind == "end" else 6], *prepared] if isinstance(prepared, list) else []
    )
    return len(numbers) >= 2 and all(isinstance(n, int) for n in numbers)


class CoordinatedLoader:
    """This consumer's view of a group: iterable (one epoch per ``iter()``), sized, with `stats`.

    Made by `coordinate`. Not for use from several threads at once. `close` (or ``with``, or the
    end of the process) leaves the group.
    """

    def __init__(self, channel: Channel, group: str, consumers: int, batches: int, timeout: float,
                 info: dict[str, Any]) -> None:  # fmt: skip
        self.group = group
        self.consumers = consumers
        self.timeout = timeout
        self.shared = channel.shared
        if self.shared:
            self._slots = _shared_slots(channel, group, info)
        else:
            self._slots = _open_slots(group, info["slots"])
        self.producer_pid: int = info["producer_pid"]
        self.coordinator_pid: int = info["coordinator_pid"]
        self._batches = batches
        self._channel = channel
        self._stats = CoordinationStats()
        self._next_epoch = 0
        self._failure: CoordinationError | None = None
        self._finalizer = weakref.finalize(self, _close, channel, self._slots)

    def __len__(self) -> int:
        return self._batches

    def __repr__(self) -> str:
        state = "failed" if self._failure else "open" if self._finalizer.alive else "closed"
        return (f"<CoordinatedLoader group={self.group!r} consumers={self.consumers} "
                f"batches={self._batches} {state}: {self._stats}>")  # fmt: skip

    @property
    def stats(self) -> CoordinationStats:
        return self._stats

    def __iter__(self) -> Iterator[Any]:
        if self._failure is not None:
            raise self._failure
        return self._epoch()

    def close(self) -> None:
        """Leaves the group; the others go on without this consumer."""
        self._finalizer()

    def __enter__(self) -> CoordinatedLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _epoch(self) -> Iterator[Any]:
        """One epoch, numbered when its first batch is asked for (an unused iterator is none)."""
        epoch = self._next_epoch
        self._next_epoch += 1
        finished = False
        try:
            self._send(("epoch", epoch))
            while True:
                message = self._receive(epoch)
                if message[0] == "end":
                    finished = True
                    self._count(message[3], epochs=1)
                    return
                _, seq, _, _, slot, meta, prepared = message
                batch = self._read(slot, meta)
                self._send(("took", seq))
                self._count(prepared, consumed=1)
                yield batch
        finally:
            if not finished and self._failure is None and self._finalizer.alive:
                with contextlib.suppress(CoordinationError):
                    self._send(("skip", epoch))

    def _read(self, slot: Any, meta: Any) -> Any:
        """The batch in ``slot``, as new tensors. In a shared group, whatever the other side
        sent is checked: a slot it names, a length the slot holds, a valid encoding."""
        if not self.shared:
            return read_batch(self._slots[slot], meta)
        if not (isinstance(slot, int) and 0 <= slot < len(self._slots) and isinstance(meta, int)):
            self._fail(f"the coordinator of group {self.group} named slot {slot!r} of "
                       f"{len(self._slots)} and {meta!r} bytes")  # fmt: skip
        fd = self._slots[slot]
        size = os.fstat(fd).st_size
        if not 0 < meta <= size:
            self._fail(f"the producer of group {self.group} announced a batch of {meta} bytes "
                       f"in a slot of {size}")  # fmt: skip
        encoded = bytearray(meta)
        read_all(fd, memoryview(encoded), 0)
        try:
            return decode(encoded)
        except TensorFormatError as error:
            self._fail(f"the producer of group {self.group} sent a batch that is not "
                       f"well-formed: {error}")  # fmt: skip

    def _count(self, prepared: tuple[int, int], consumed: int = 0, epochs: int = 0) -> None:
        stats = self._stats
        self._stats = replace(stats, batches_prepared=prepared[0], items_prepared=prepared[1],
                              batches_consumed=stats.batches_consumed + consumed,
                              epochs_completed=stats.epochs_completed + epochs)  # fmt: skip

    def _send(self, message: Message) -> None:
        if not self._finalizer.alive:
            raise CoordinationError(f"this loader has left group {self.group}")
        try:
            self._channel.send(message, self.timeout)
        except (ConnectionClosed, OSError):
            reported = self._last_word()
            if reported is not None:
                self._fail(reported)
            self._fail(self._coordinator_gone(), remove_slots=True)

    def _last_word(self) -> str | None:
        """The error the coordinator sent before it closed, if it did (a consumer that was not
        reading when the group failed finds the socket closed when it next sends)."""
        with contextlib.suppress(ConnectionClosed, TimeoutError, ProtocolError, OSError):
            while True:
                message = self._channel.receive(LAST_WORD_S)
                if message[0] == "error" and len(message) == 2:
                    return str(message[1])
        return None

    def _coordinator_gone(self) -> str:
        return (
            f"producer of group {self.group} died: "
            f"its coordinator (pid {self.coordinator_pid}) went away"
        )

    def _receive(self, epoch: int) -> Message:
        """The next batch or end of ``epoch``; what is left of older epochs is dropped."""
        if not self._finalizer.alive:
            raise CoordinationError(f"this loader has left group {self.group}")
        while True:
            started = time.monotonic()
            try:
                message = self._channel.receive(self.timeout)
            except TimeoutError:
                raise CoordinationError(
                    f"no batch from the producer of group {self.group} in {self.timeout:g} s: "
                    "it prepares slower than that, or a consumer of the group stopped taking "
                    "batches without leaving"
                ) from None
            except (ConnectionClosed, OSError):
                self._fail(self._coordinator_gone(), remove_slots=True)
            except ProtocolError as error:
                self._fail(f"the coordinator of group {self.group} sent {error}")
            finally:
                waited = time.monotonic() - started
                self._stats = replace(self._stats, wait_s=self._stats.wait_s + waited)
            if self.shared and not _consumer_message(message):
                self._fail(f"the coordinator of group {self.group} sent {message!r:.100}")
            kind = message[0]
            if kind == "error":
                self._fail(str(message[1]))
            if (kind == "batch" and message[2] == epoch) or (kind == "end" and message[1] == epoch):
                return message
            if kind == "batch":  # of an epoch this consumer abandoned: let it go
                self._send(("took", message[1]))

    def _fail(self, text: str, remove_slots: bool = False) -> NoReturn:
        """Records the group's end and raises it. The coordinator removes the shared memory
        before it reports a failure; when it died instead (``remove_slots``), we do."""
        self._failure = CoordinationError(text)
        if remove_slots and not self.shared:  # a shared group's slots have no names
            server.remove_slots(self.group)
        self._finalizer()
        raise self._failure
