"""Coordinated preparation with real processes: k consumers, one producer, one coordinator.

Consumers run in a pool of spawned processes shared by the tests (or, where the test must reach a
consumer's loader, in threads of this process). The datasets below are fault doubles: they log
every ``__getitem__`` to a file (so preparation is counted outside the code under test), and can
raise or SIGKILL their process at a chosen index.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from kernelfleet.tools.dataload.coordinate import CoordinationError, coordinate
from kernelfleet.tools.dataload.coordinate_server import slot_paths

ITEMS = 30
BATCH = 4  # 8 batches an epoch, the last of 2: more than the ring's 4 slots


class LoggedDataset(Dataset[tuple[torch.Tensor, int]]):
    """``ITEMS`` samples; each ``__getitem__`` appends its index to ``log``; ``fault`` at ``at``."""

    def __init__(self, log: str, fault: str = "", at: int = -1) -> None:
        self.log = log
        self.fault = fault
        self.at = at

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.at and self.fault == "raise":
            raise ValueError(f"bad sample {index}")
        if index == self.at and self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"%d\n" % index)
        os.close(fd)
        return torch.full((3,), float(index)) + torch.arange(3.0) / 10, index


def make_loader(log: str, workers: int = 0, fault: str = "", at: int = -1) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(2021)
    return DataLoader(LoggedDataset(log, fault, at), batch_size=BATCH, shuffle=True,
                      num_workers=workers, generator=generator)  # fmt: skip


def consume(
    group: str, k: int, log: str, epochs: int, workers: int, fault: str = ""
) -> dict[str, Any]:
    """One consumer: ``epochs`` epochs of batches, or the error it got."""
    at = 13 if fault else -1
    loader = coordinate(make_loader(log, workers, fault, at), group, consumers=k, timeout=60)
    seen: list[list[Any]] = []
    try:
        for _ in range(epochs):
            seen.append([])
            for batch in loader:
                seen[-1].append(batch)
    except CoordinationError as error:
        return {"error": str(error), "pids": (loader.producer_pid, loader.coordinator_pid)}
    finally:
        loader.close()
    assert len(loader) == 8
    return {
        "epochs": seen,
        "stats": loader.stats,
        "pids": (loader.producer_pid, loader.coordinator_pid),
    }


@pytest.fixture(scope="module")
def consumers() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=4, mp_context=context) as pool:
        yield pool


def run_group(
    pool: concurrent.futures.ProcessPoolExecutor, k: int, *args: Any
) -> list[dict[str, Any]]:
    futures = [pool.submit(consume, *args) for _ in range(k)]
    return [future.result(timeout=90) for future in futures]


def group_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def assert_group_gone(group: str, pids: tuple[int, int]) -> None:
    """The producer and coordinator exit (promptly), leaving no slot file."""
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)
    assert not [p for p in slot_paths(group) if os.path.exists(p)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def logged(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


@pytest.mark.slow
@pytest.mark.parametrize(("k", "workers"), [(2, 2), (4, 0)])
def test_k_consumers_see_the_same_batches_prepared_once(
    consumers: concurrent.futures.ProcessPoolExecutor, tmp_path: Path, k: int, workers: int
) -> None:
    group, log, epochs = group_name(), tmp_path / "getitem.log", 2
    results = run_group(consumers, k, group, k, str(log), epochs, workers)
    first = results[0]["epochs"]
    for other in results[1:]:
        torch.testing.assert_close(other["epochs"], first)
    # the order is the producer's loader's own: the seeded sampler, reshuffled each epoch
    reference = make_loader(str(tmp_path / "reference.log"))
    torch.testing.assert_close(first, [list(reference) for _ in range(epochs)])
    assert first[0][0][1].tolist() != first[1][0][1].tolist()
    for epoch in first:
        assert sorted(torch.cat([labels for _, labels in epoch]).tolist()) == list(range(ITEMS))
    # prepared once per sample per epoch for the whole group, not k times
    assert sorted(logged(log)) == sorted(list(range(ITEMS)) * epochs)
    for result in results:
        stats = result["stats"]
        assert (stats.items_prepared, stats.batches_prepared) == (ITEMS * epochs, 8 * epochs)
        assert (stats.batches_consumed, stats.epochs_completed) == (8 * epochs, epochs)
    assert_group_gone(group, results[0]["pids"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "expected"),
    [("raise", "ValueError: bad sample 13"), ("sigkill", "producer of group {} died (signal 9)")],
)
def test_a_failing_producer_fails_every_consumer(
    consumers: concurrent.futures.ProcessPoolExecutor, tmp_path: Path, fault: str, expected: str
) -> None:
    group = group_name()
    results = run_group(consumers, 2, group, 2, str(tmp_path / "log"), 1, 0, fault)
    for result in results:
        assert expected.format(group) in result["error"]
    assert results[0]["pids"] == results[1]["pids"]
    assert_group_gone(group, results[0]["pids"])


def in_threads(*work: Callable[[], Any]) -> list[Any]:
    """Runs each callable in its own thread; returns what each returned or raised."""
    results: list[Any] = [None] * len(work)

    def run(i: int) -> None:
        try:
            results[i] = work[i]()
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return results


@pytest.mark.slow
def test_a_group_that_does_not_fill_fails_naming_how_many_joined(tmp_path: Path) -> None:
    group = group_name()
    with pytest.raises(
        CoordinationError, match=f"only 1 of 2 consumers joined group {group} within 1.5 s"
    ):
        coordinate(make_loader(str(tmp_path / "log")), group, consumers=2, timeout=1.5)
    assert not [p for p in slot_paths(group) if os.path.exists(p)]


@pytest.mark.slow
def test_a_differing_loader_is_refused(tmp_path: Path) -> None:
    group, log = group_name(), str(tmp_path / "log")
    other = DataLoader(LoggedDataset(log), batch_size=BATCH + 1)
    results = in_threads(
        lambda: coordinate(make_loader(log), group, consumers=2, timeout=2),
        lambda: coordinate(other, group, consumers=2, timeout=2),
    )
    messages = sorted(str(result) for result in results)
    assert all(isinstance(result, CoordinationError) for result in results), results
    assert "only 1 of 2 consumers joined" in messages[0]
    assert f"this loader differs from group {group}'s: batch_size" in messages[1]


@pytest.mark.slow
def test_consumers_that_leave_or_skip_do_not_hold_the_others(tmp_path: Path) -> None:
    group, log = group_name(), str(tmp_path / "log")
    loaders = in_threads(
        *[lambda: coordinate(make_loader(log), group, consumers=2, timeout=20)] * 2
    )
    with pytest.raises(CoordinationError, match=f"group {group} already has its 2 consumers"):
        coordinate(make_loader(log), group, consumers=2, timeout=20)
    leaver, stayer = loaders

    def leave() -> list[torch.Tensor]:
        next(iter(leaver))  # abandons epoch 0: its iterator closes and skips the rest
        stale = iter(leaver)
        next(stale)  # abandons epoch 1 but keeps the iterator: epoch 2 lets the rest go
        labels = [labels for _, labels in leaver]  # all of epoch 2
        leaver.close()  # and leaves for good
        del stale
        return labels

    def stay() -> list[list[torch.Tensor]]:
        return [[labels for _, labels in stayer] for _ in range(4)]

    left, stayed = in_threads(leave, stay)
    torch.testing.assert_close(left, stayed[2])
    assert [len(epoch) for epoch in stayed] == [8, 8, 8, 8]
    assert stayer.stats.items_prepared == 4 * ITEMS
    pids = (stayer.producer_pid, stayer.coordinator_pid)
    stayer.close()
    assert_group_gone(group, pids)


@pytest.mark.slow
def test_a_killed_coordinator_fails_its_consumers_and_they_clean_up(tmp_path: Path) -> None:
    group, log = group_name(), str(tmp_path / "log")
    loaders = in_threads(
        *[lambda: coordinate(make_loader(log), group, consumers=2, timeout=20)] * 2
    )
    epochs = [iter(loader) for loader in loaders]
    for epoch in epochs:
        next(epoch)
    os.kill(loaders[0].coordinator_pid, signal.SIGKILL)
    for epoch in epochs:
        with pytest.raises(
            CoordinationError, match=f"producer of group {group} died: its coordinator"
        ):
            for _ in epoch:
                pass
    assert_group_gone(group, (loaders[0].producer_pid, loaders[0].coordinator_pid))


NOTEBOOK_CELL = """
import torch
from torch.utils.data import DataLoader, Dataset
from kernelfleet.tools.dataload.coordinate import coordinate

class Squares(Dataset):  # defined in __main__, as a notebook cell defines it
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return torch.tensor(i * i)

with coordinate(DataLoader(Squares(), batch_size=4), {group!r}, consumers=1, timeout=30) as loader:
    print([batch.tolist() for batch in loader], loader.stats.items_prepared)
"""


@pytest.mark.slow
def test_a_dataset_defined_in_main_reaches_the_producer() -> None:
    group = group_name()
    code = NOTEBOOK_CELL.format(group=group)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 1, 4, 9], [16, 25]] 6"
