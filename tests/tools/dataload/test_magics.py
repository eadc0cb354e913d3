"""``%dataload`` in an in-process IPython shell: analyze a notebook's loader and model, cache a
dataset in shared memory and drop it, refuse bad input with ``UsageError``. (In a live kernel
of a fleet: the slow test at the end.)"""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.kernels.magics import registry
from kernelfleet.tools.dataload.cache import MinioCache, drop_cache
from kernelfleet.tools.dataload.magics import Report, dataload_parser, load
from kernelfleet.tools.dataload.share import check_key, new_key

NOTEBOOK = """
import torch
from kernelfleet.tools.dataload.synthetic import SyntheticDataset
ds = SyntheticDataset(24, item_bytes=32, fetch_s=0.001, decode_s=0.001)
loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
"""


@pytest.fixture
def shell() -> InteractiveShell:
    pytest.importorskip("torch")
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    load(shell)
    assert shell.run_cell(NOTEBOOK).success
    return shell


def test_analyze_a_notebooks_loader_and_model(shell: InteractiveShell) -> None:
    report = shell.run_line_magic(
        "dataload", "analyze loader model --batches 3 --as-found --cpus 1,3"
    )
    assert isinstance(report, Report)
    assert report.analysis.batches == 3
    text = repr(report)
    assert "as found (not asked to drop it)" in text
    assert "what-if: predicted epoch seconds" in text
    rows = [line.split()[0] for line in text.splitlines()[-2:]]
    assert rows == ["1", "3"]
    assert "cache 100%" in text
    assert report._repr_html_().startswith("<pre>")


def test_cache_a_dataset_then_drop_it(shell: InteractiveShell, cache_name: str) -> None:
    shell.run_line_magic("dataload", f"cache ds --size 4KiB --name {cache_name}")
    cached = shell.run_line_magic("dataload", f"cache ds --size 4KiB --name {cache_name}")
    assert isinstance(cached, MinioCache)
    assert cached.name == cache_name
    for _ in range(2):
        for index in range(len(cached)):
            cached[index]
    capacity = cached.cached_items
    assert 0 < capacity < 24  # 4 KiB less the index holds some of the 24 items
    assert cached.reset_counts().hits == capacity
    assert f"{capacity} of 24 items" in repr(cached)
    cached.close()
    assert shell.run_line_magic("dataload", f"cache --drop {cache_name}") is None
    with pytest.raises(UsageError, match="no cache named"):
        shell.run_line_magic("dataload", f"cache --drop {cache_name}")
    assert not Path(f"/dev/shm/kernelfleet-minio-{cache_name}").exists()


def test_an_unnamed_cache_takes_the_datasets_identity(shell: InteractiveShell) -> None:
    cached = shell.run_line_magic("dataload", "cache ds --size 1MB")
    try:
        assert cached.name.startswith("syntheticdataset-")
    finally:
        cached.close()
        assert drop_cache(cached.name)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("cache ds --size 100TB", "larger than the free shared memory in /dev/shm"),
        ("cache ds --size 8XB", "is not a size"),
        ("cache ds", "give the notebook's DATASET and --size"),
        ("cache ds --size 1MB --drop x", "give --drop NAME alone"),
        ("cache nothing --size 1MB", "nothing is not defined"),
        ("cache loader --size 1MB", "not a map-style dataset"),
        ("analyze loader", "the following arguments are required: model"),
        ("analyze loader model --batches 1", "expected a whole number from 2"),
        ("analyze loader model --cpus 0", "expected a whole number from 1"),
        ("analyze ds model --as-found", "batching torch DataLoader"),
        ("coordinate loader --group g", "the following arguments are required: --consumers"),
        ("frobnicate", "invalid choice"),
        ("cache ds --size '1MB", "No closing quotation"),
    ],
)
def test_bad_input_is_a_usage_error(shell: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("dataload", line)


def test_the_refusal_gives_both_sizes(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("dataload", "cache ds --size 100TB")
    assert "a cache of 100.00 TB (100000000000000 bytes)" in str(refused.value)
    assert str(refused.value).endswith("bytes)")


def test_coordinate_parses_into_the_agreed_call() -> None:
    args = dataload_parser().parse_args(
        ["coordinate", "loader", "--group", "hp", "--consumers", "4"]
    )
    assert (args.command, args.loader, args.group, args.consumers) == (
        "coordinate",
        "loader",
        "hp",
        4,
    )


def test_help(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    assert shell.run_line_magic("dataload", "cache --help") is None
    assert "usage: %dataload cache" in capsys.readouterr().out


def test_registered_as_kernelfleets_own_magic() -> None:
    assert registry.OWN["dataload"] == "kernelfleet.tools.dataload.magics:load"


# ---- live: a kernel of a real fleet ------------------------------------------------------------


def result_text(reply: Any) -> str:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return results[-1]["content"]["data"]["text/plain"]


@pytest.mark.slow
async def test_dataload_magic_in_a_fleet_kernel(fleet: Any, cache_name: str) -> None:
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(NOTEBOOK)
        assert setup.reply["status"] == "ok", setup.reply
        analyzed = await client.execute("%dataload analyze loader model --batches 3 --as-found")
        assert "fetch stall" in result_text(analyzed)
        cached = await client.execute(
            f"cached = %dataload cache ds --size 1MB --name {cache_name}\n"
            "for epoch in range(2):\n"
            "    _ = [cached[i] for i in range(len(cached))]\n"
            "cached.reset_counts().hits"
        )
        assert result_text(cached) == "24"  # the second epoch: all hits
        shown = await client.execute("cached")
        assert "24 of 24 items" in result_text(shown)
        # the host's other processes (this test's) see the kernel's items
        here = MinioCache(list(range(24)), 10**6, name=cache_name)
        assert here.cached_items == 24
        here.close()
        bad = await client.execute("%dataload cache ds --size 100TB")
        assert bad.reply["ename"] == "UsageError"
        assert "larger than the free shared memory" in bad.reply["evalue"]
        dropped = await client.execute(f"cached.close()\n%dataload cache --drop {cache_name}")
        assert dropped.reply["status"] == "ok", dropped.reply
        assert not drop_cache(cache_name)  # gone already
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


PEER = """
import json, sys, torch
from kernelfleet.tools.dataload.coordinate import coordinate
from kernelfleet.tools.dataload.synthetic import SyntheticDataset
loader = torch.utils.data.DataLoader(SyntheticDataset(24, item_bytes=32), batch_size=4,
                                     shuffle=True, generator=torch.Generator().manual_seed(7))
with coordinate(loader, sys.argv[1], consumers=2) as batches:
    print(json.dumps([labels.tolist() for _, labels in batches]))
"""


@pytest.mark.slow
async def test_dataload_coordinate_in_a_fleet_kernel(fleet: Any) -> None:
    """The kernel and a second consumer on its host (a process of the kernel's own user: kernels
    that run as per-kernel users cannot share a group, docs/dataload.md) get one sequence of
    batches, each prepared once."""
    group = f"live-{uuid.uuid4().hex[:8]}"
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(
            "import subprocess, sys, json, torch\n"
            "from kernelfleet.tools.dataload.synthetic import SyntheticDataset\n"
            "loader = torch.utils.data.DataLoader(SyntheticDataset(24, item_bytes=32),\n"
            "    batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))\n"
            f"peer = subprocess.Popen([sys.executable, '-c', {PEER!r}, {group!r}],\n"
            "                        stdout=subprocess.PIPE, text=True)"
        )
        assert setup.reply["status"] == "ok", setup.reply
        consumed = await client.execute(
            f"batches = %dataload coordinate loader --group {group} --consumers 2\n"
            "mine = [labels.tolist() for _, labels in batches]\n"
            "theirs = json.loads(peer.communicate(timeout=90)[0])\n"
            "(mine == theirs, len(mine), batches.stats.items_prepared)"
        )
        assert result_text(consumed) == "(True, 6, 24)", consumed.reply
        bad = await client.execute("%dataload coordinate loader --group g --consumers 0")
        assert bad.reply["ename"] == "UsageError"
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_coordinate_share_alone_prints_a_new_key(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    group = f"magic-{uuid.uuid4().hex[:8]}"
    batches = shell.run_line_magic(
        "dataload", f"coordinate loader --group {group} --consumers 1 --share"
    )
    printed = capsys.readouterr().out
    key = printed.split(f"share key of the group {group}: ")[1].split()[0]
    assert check_key(key) == key
    assert f"--group {group} --consumers 1 --share {key}" in printed
    with batches:
        assert len(list(batches)) == 6
    assert batches.shared


def test_coordinate_refuses_a_malformed_key(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="share key 'abc' is not one"):
        shell.run_line_magic("dataload", "coordinate loader --group g --consumers 2 --share abc")


SHARED_NOTEBOOK = """
import os, threading, torch
from kernelfleet.tools.dataload.coordinate import coordinate
from kernelfleet.tools.dataload.synthetic import SyntheticDataset
slow = torch.utils.data.DataLoader(SyntheticDataset(24, item_bytes=32, fetch_s=0.3), batch_size=4)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_kernels_of_two_users_share_a_group_by_key(fleet: Any) -> None:
    """Two kernels (users of their own where the agent is root) join one group with a key: one
    order, one preparation; the group refuses a wrong key by name, the guest cannot reach the
    owner's descriptors, and a killed producer fails both kernels' next batch."""
    group, key = f"live-share-{uuid.uuid4().hex[:8]}", new_key()
    kernels = [fleet.start_kernel(), fleet.start_kernel()]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    try:
        for client in clients:
            setup = await client.execute(NOTEBOOK + SHARED_NOTEBOOK)
            assert setup.reply["status"] == "ok", setup.reply
        line = f"%dataload coordinate loader --group {group} --consumers 2 --share {key}"
        cell = (
            f"batches = {line}\n"
            "mine = [labels.tolist() for _, labels in batches]\n"
            "(os.getuid(), mine, batches.stats.items_prepared, batches.producer_pid)"
        )
        replies = await asyncio.gather(*(client.execute(cell, timeout=120) for client in clients))
        (uid_a, seen_a, prepared_a, producer_a), (uid_b, seen_b, prepared_b, producer_b) = (
            ast.literal_eval(result_text(reply)) for reply in replies
        )
        assert seen_a == seen_b
        assert len(seen_a) == 6
        assert sorted(label for batch in seen_a for label in batch) == sorted(
            i % 10 for i in range(24)
        )
        assert prepared_a == prepared_b == 24  # once for the group, not once per kernel
        assert producer_a == producer_b
        if uid_a != os.geteuid():  # per-kernel users (a root agent): each kernel its own
            assert uid_a != uid_b

        # the second group: the first kernel forms it (in a thread, so its cell returns) ...
        owner, guest = clients
        second = f"{group}-2"
        hold = await owner.execute(
            "held = {}\n"
            f"holder = threading.Thread(target=lambda: held.update(b=coordinate(slow, {second!r}, "
            f"consumers=2, share={key!r}, timeout=60)))\n"
            "holder.start()\n"
            "import time; time.sleep(3)"
        )
        assert hold.reply["status"] == "ok", hold.reply
        wrong = await guest.execute(
            f"%dataload coordinate slow --group {second} --consumers 2 --share {new_key()}"
        )
        assert wrong.reply["ename"] == "CoordinationError", wrong.reply
        assert f"group {second} refused this share key" in wrong.reply["evalue"]
        joined = await guest.execute(
            f"theirs = %dataload coordinate slow --group {second} --consumers 2 --share {key}\n"
            "rights = []\n"
            "try:\n"
            "    os.listdir(f'/proc/{theirs.coordinator_pid}/fd')\n"
            "    rights.append('list')\n"
            "except PermissionError:\n"
            "    pass\n"
            "try:\n"
            "    os.pwrite(theirs._slots[0], b'x', 0)\n"
            "    rights.append('write')\n"
            "except OSError:\n"
            "    pass\n"
            "(theirs.producer_pid, rights, os.getuid())"
        )
        producer, rights, guest_uid = ast.literal_eval(result_text(joined))
        assert "write" not in rights
        if guest_uid != uid_a:
            assert rights == [], "another user's coordinator keeps its descriptors"
        os.kill(producer, signal.SIGKILL)
        expected = f"producer of group {second} died (signal 9)"
        failed = await guest.execute("list(theirs)", timeout=60)
        assert failed.reply["ename"] == "CoordinationError"
        assert expected in failed.reply["evalue"]
        failed = await owner.execute("holder.join(); list(held['b'])", timeout=60)
        assert failed.reply["ename"] == "CoordinationError"
        assert expected in failed.reply["evalue"]
    finally:
        for client in clients:
            client.close()
        for kernel_id in kernels:
            fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_kernels_of_two_users_share_a_cache_through_their_agent(
    private_fleet: Any,
) -> None:
    """Two kernels on one host (users of their own where the agent is root) share one cache that
    the host agent's broker holds: the second hits exactly what the first filled; a wrong key
    and a size beyond free shared memory are refused with what is wrong."""
    fleet = private_fleet(hosts=1, gpus=0)
    kernels = [fleet.start_kernel(), fleet.start_kernel()]
    clients = [await fleet.connect(kernel_id) for kernel_id in kernels]
    first, second = clients
    try:
        for client in clients:
            setup = await client.execute(NOTEBOOK + "import os")
            assert setup.reply["status"] == "ok", setup.reply
        made = await first.execute(
            "cached = %dataload cache ds --size 1MB --name live --share\n"
            "_ = [cached[i] for i in range(12)]\n"  # half the dataset: 12 misses, filled once
            "(cached.reset_counts().misses, cached.cached_items, os.getuid())"
        )
        printed = made.stdout
        key = printed.split("share key of the cache live: ")[1].split()[0]
        assert result_text(made).startswith("(12, 12, ")
        uid_first = ast.literal_eval(result_text(made))[2]
        read = await second.execute(
            f"cached = %dataload cache ds --size 1MB --name live --share {key}\n"
            "items = [cached[i] for i in range(len(cached))]\n"
            "counts = cached.reset_counts()\n"
            "same = all(torch.equal(a[0], ds[i][0]) for i, a in enumerate(items))\n"
            "(counts.hits, counts.misses, cached.cached_items, same, os.getuid())"
        )
        hits, misses, stored, same, uid_second = ast.literal_eval(result_text(read))
        assert (hits, misses, stored, same) == (12, 12, 24, True)
        if uid_first != os.geteuid():  # per-kernel users
            assert uid_first != uid_second
        wrong = await second.execute(
            f"%dataload cache ds --size 1MB --name live --share {new_key()}"
        )
        assert wrong.reply["ename"] == "UsageError"
        assert "the shared cache 'live' refused this share key" in wrong.reply["evalue"]
        huge = await second.execute("%dataload cache ds --size 100TB --name huge --share")
        assert huge.reply["ename"] == "UsageError"
        assert huge.reply["evalue"].startswith(
            "a cache of 100000.00 GB (100000000000000 bytes) is larger than the free shared"
        )
        dropped = await second.execute(f"%dataload cache --drop live --share {key}")
        assert dropped.stdout == "dropped the shared cache 'live'\n", dropped.reply
        gone = await first.execute(f"%dataload cache --drop live --share {key}")
        assert "the host agent holds no shared cache named 'live'" in gone.reply["evalue"]
    finally:
        for client in clients:
            client.close()
        for kernel_id in kernels:
            fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
