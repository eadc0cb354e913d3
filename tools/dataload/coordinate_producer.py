"""The producer of a coordinated group: prepares each batch once, into a free slot.

Run by the coordinator (`coordinate_server`) as ``python -m
kernelfleet.tools.dataload.coordinate_producer CONTROL_FD SLOT_FDS``, the pickled loader on its
standard input. It iterates the loader (so the loader's own workers, sampler, generator and
collate function do the work) one epoch per ``("epoch", e)`` it is sent, writes each batch into a
slot the coordinator has freed, and announces it. The dataset is wrapped in `CountingDataset`, so
each announcement says how many ``__getitem__`` calls the loader made so far, workers included.

In a shared group (a third argument, ``shared``) each batch goes into its slot in
`tensor_format` instead, and its ``meta`` is the encoding's byte length: the consumers may be
other users, who must not unpickle what this process wrote.

An exception in the loader is sent as ``("error", traceback)`` and the producer exits with 1; when
the control socket closes (the coordinator is gone) it exits with 0.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import socket
import sys
import time
import traceback
from collections import deque
from typing import Any

from torch.utils.data import DataLoader, Dataset

from kernelfleet.tools.dataload import tensor_format
from kernelfleet.tools.dataload.coordinate_batches import write_all, write_batch
from kernelfleet.tools.dataload.coordinate_wire import Channel, ConnectionClosed

ERROR_LINGER_S = 5.0
"""Longest wait, after sending an error, for the coordinator to close its end (`_linger`)."""


class CountingDataset(Dataset[Any]):
    """A map-style dataset that counts the items fetched from it, in any process.

    ``counter`` is a `multiprocessing.Value`, shared with the loader's workers (forked, or spawned
    with the dataset pickled into them).
    """

    def __init__(self, dataset: Any, counter: Any) -> None:
        self.dataset = dataset
        self.counter = counter

    def _count(self, n: int) -> None:
        with self.counter.get_lock():
            self.counter.value += n

    def __getitem__(self, index: Any) -> Any:
        self._count(1)
        return self.dataset[index]

    def __getitems__(self, indices: list[Any]) -> Any:
        self._count(len(indices))
        fetch_many = getattr(self.dataset, "__getitems__", None)
        if fetch_many is not None:
            return fetch_many(indices)
        return [self.dataset[i] for i in indices]

    def __len__(self) -> int:
        return len(self.dataset)


def count_items(loader: DataLoader[Any]) -> Any:
    """Wraps ``loader``'s dataset in a `CountingDataset`; returns the shared counter."""
    context = loader.multiprocessing_context or multiprocessing.get_context()
    counter = context.Value("q", 0)
    # DataLoader refuses a new dataset after construction; the sampler keeps the original for
    # its length, and the wrapper fetches exactly what the original would.
    object.__setattr__(loader, "dataset", CountingDataset(loader.dataset, counter))
    return counter


class Producer:
    """Makes epochs of batches on request, each into a slot the coordinator has freed."""

    def __init__(self, loader: DataLoader[Any], control: Channel, slot_fds: list[int],
                 shared: bool = False) -> None:  # fmt: skip
        self.loader = loader
        self.shared = shared
        self.control = control
        self.slot_fds = slot_fds
        self.counter = count_items(loader)
        self.free: deque[int] = deque()
        self.epochs: deque[int] = deque()
        self.batches = 0

    def take(self) -> None:
        """Waits for one message from the coordinator and files it."""
        message = self.control.receive(timeout=None)
        if message[0] == "free":
            self.free.append(message[1])
        elif message[0] == "epoch":
            self.epochs.append(message[1])

    def prepared(self) -> tuple[int, int]:
        return self.batches, self.counter.value

    def run(self) -> None:
        while True:
            while not self.epochs:
                self.take()
            self.epoch(self.epochs.popleft())

    def write(self, fd: int, batch: Any) -> bytes | int:
        """Puts ``batch`` into the slot file ``fd``; returns its ``meta``."""
        if not self.shared:
            return write_batch(fd, batch)
        encoded = tensor_format.encode(batch)
        if os.fstat(fd).st_size < len(encoded):
            os.ftruncate(fd, len(encoded))
        write_all(fd, memoryview(encoded), 0)
        return len(encoded)

    def epoch(self, epoch: int) -> None:
        index = -1
        for index, batch in enumerate(self.loader):
            while not self.free:
                self.take()
            slot = self.free.popleft()
            meta = self.write(self.slot_fds[slot], batch)
            self.batches += 1
            self.control.send(
                ("batch", self.batches - 1, epoch, index, slot, meta, self.prepared())
            )
        self.control.send(("end", epoch, index + 1, self.prepared()))


def main(argv: list[str]) -> int:
    control = Channel(socket.socket(fileno=int(argv[0])))
    slot_fds = [int(fd) for fd in argv[1].split(",")]
    try:
        loader = pickle.loads(sys.stdin.buffer.read())
        Producer(loader, control, slot_fds, shared=argv[2:] == ["shared"]).run()
    except ConnectionClosed:
        return 0
    except BaseException as error:
        headline = "".join(traceback.format_exception_only(error)).strip()
        with contextlib.suppress(ConnectionClosed):
            control.send(
                ("error", f"{headline}\n\nthe producer's traceback:\n{traceback.format_exc()}")
            )
            _linger(control)
        return 1
    return 0


def _linger(control: Channel) -> None:
    """Wait (a few seconds at most) until the coordinator, told of the error, closes its end.
    Closing first with its messages unread would reset the connection, and a reset makes the
    coordinator's kernel drop the error message still unread on its side: the consumers would
    learn only that the producer died."""
    control.sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + ERROR_LINGER_S
    with contextlib.suppress(OSError):
        while (remaining := deadline - time.monotonic()) > 0:
            control.sock.settimeout(remaining)
            if not control.sock.recv(1 << 16):
                return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
