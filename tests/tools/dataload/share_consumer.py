"""One consumer of a shared coordination group, run as a process of its own (as a user of its own
when the tests run as root): ``python share_consumer.py GROUP KEY CONSUMERS LOG_DIR [slow]``.

It prints one JSON line once it joined (its pids and what it could do with its slot descriptors)
and one when it is done: the labels of each batch of 2 epochs and its stats, or the error.
The dataset logs each ``__getitem__`` to ``LOG_DIR/getitem-<uid>.log``, so the test counts
preparation outside the code under test and sees which user's process prepared.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from kernelfleet.tools.dataload.coordinate import CoordinationError, coordinate

ITEMS, BATCH, EPOCHS = 24, 4, 2


class LoggedDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, log_dir: str, slow: bool) -> None:
        self.log_dir = log_dir
        self.slow = slow

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.slow:
            time.sleep(0.5)
        path = f"{self.log_dir}/getitem-{os.getuid()}.log"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, b"%d\n" % index)
        os.close(fd)
        return torch.full((2,), float(index)), index


def slot_rights(fds: list[int]) -> dict[str, Any]:
    """What this process can do with its slots' descriptors besides reading them."""
    fd = fds[0]
    rights: dict[str, Any] = {}
    try:
        os.pwrite(fd, b"x", 0)
        rights["write"] = True
    except OSError as error:
        rights["write"] = error.strerror
    try:
        os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
        rights["reopen_rw"] = True
    except OSError as error:
        rights["reopen_rw"] = error.strerror
    try:
        os.ftruncate(fd, 0)
        rights["truncate"] = True
    except OSError as error:
        rights["truncate"] = error.strerror
    return rights


def main(group: str, key: str, consumers: int, log_dir: str, slow: bool) -> None:
    loader = DataLoader(LoggedDataset(log_dir, slow), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(11))  # fmt: skip
    try:
        batches = coordinate(loader, group, consumers=consumers, share=key, timeout=30)
    except CoordinationError as error:
        print(json.dumps({"error": str(error)}), flush=True)
        return
    joined = {
        "uid": os.getuid(),
        "producer_pid": batches.producer_pid,
        "coordinator_pid": batches.coordinator_pid,
        "rights": slot_rights(batches._slots),
    }
    print(json.dumps(joined), flush=True)
    epochs: list[list[list[int]]] = []
    try:
        for _ in range(EPOCHS):
            epochs.append([labels.tolist() for _, labels in batches])
    except CoordinationError as error:
        print(json.dumps({"error": str(error)}), flush=True)
        return
    finally:
        batches.close()
    stats = batches.stats
    print(json.dumps({"epochs": epochs, "items_prepared": stats.items_prepared,
                      "batches_prepared": stats.batches_prepared}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:] == ["slow"])
