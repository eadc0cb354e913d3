"""The GPU ledger: literal cases, and random event sequences checked after every event."""

from __future__ import annotations

import random

import pytest

from kernelfleet.errors import (
    Conflict,
    FleetError,
    GpusUnavailable,
    InvalidRequest,
    LedgerInconsistent,
    NoCapacity,
    NotFound,
)
from kernelfleet.gateway.ledger import Binding, GpuLedger, device_ids_of
from kernelfleet.gateway.ledger_records import WorkerHold
from kernelfleet.kernels.agent.gpus import VirtualInventory
from kernelfleet.scheduler import HostSnapshot


def ledger_with(**hosts: int) -> GpuLedger:
    ledger = GpuLedger()
    for host_id, count in hosts.items():
        ledger.set_host(host_id, [str(i) for i in range(count)])
    return ledger


def test_device_ids_come_from_the_host_report_in_index_order() -> None:
    gpus = [gpu.to_dict() for gpu in VirtualInventory(3, "h1").devices()]
    assert device_ids_of(list(reversed(gpus))) == ("0", "1", "2")
    assert device_ids_of([]) == ()
    with pytest.raises(InvalidRequest, match="integer 'index'"):
        device_ids_of([{"uuid": "GPU-x"}])


def test_a_cell_commits_then_releases_and_idle_replicas_subscribe() -> None:
    ledger = ledger_with(h1=2)
    for replica in ("r1", "r2"):
        ledger.subscribe("h1", "k", replica, 1)
    assert ledger.host_snapshot("h1") == HostSnapshot(
        "h1", 2, 2, 0, replicas=2, free_gpu_speeds=(1.0, 1.0)
    )

    commitment = ledger.commit("h1", "k", "r1", "cell-1", 1)
    assert commitment.device_ids == ("0",)
    assert commitment.displaced == ()
    # policies count the running replica's claim too; the admin view only idle ones
    assert ledger.host_snapshot("h1") == HostSnapshot(
        "h1", 2, 2, 1, replicas=2, free_gpu_speeds=(1.0,)
    )
    assert ledger.view("h1").subscribed == 1
    assert ledger.totals().committed == 1
    assert ledger.totals().demand == 2

    assert ledger.release("k", cell_id="cell-1") == (commitment.binding,)
    assert ledger.release("k", cell_id="cell-1") == ()  # idempotent
    assert ledger.host_snapshot("h1") == HostSnapshot(
        "h1", 2, 2, 0, replicas=2, free_gpu_speeds=(1.0, 1.0)
    )
    ledger.check_invariants()


def test_lowest_free_device_is_chosen() -> None:
    ledger = ledger_with(h1=3)
    for replica in ("a", "b", "c"):
        ledger.subscribe("h1", replica, "r", 1)
    assert ledger.commit("h1", "a", "r", "x", 1).device_ids == ("0",)
    assert ledger.commit("h1", "b", "r", "x", 1).device_ids == ("1",)
    ledger.release("a", warm=False)
    assert ledger.commit("h1", "c", "r", "x", 1).device_ids == ("0",)


def test_too_many_gpus_now_or_ever_are_distinct_errors() -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "a", "r", 2)
    ledger.subscribe("h1", "b", "r", 2)
    ledger.commit("h1", "a", "r", "x", 1)
    with pytest.raises(
        GpusUnavailable, match="host h1 has 1 of 2 GPU\\(s\\) free; the cell needs 2"
    ):
        ledger.commit("h1", "b", "r", "y", 2)
    with pytest.raises(NoCapacity, match="host h1 has 2 GPU\\(s\\); the cell needs 3"):
        ledger.commit("h1", "b", "r", "y", 3)
    with pytest.raises(InvalidRequest):
        ledger.commit("h1", "b", "r", "y", -1)
    ledger.check_invariants()


def test_commit_needs_a_subscription_on_that_host_and_one_cell_at_a_time() -> None:
    ledger = ledger_with(h1=2, h2=2)
    with pytest.raises(NotFound):
        ledger.subscribe("h9", "k", "r", 1)
    with pytest.raises(Conflict, match="not on host h1"):
        ledger.commit("h1", "k", "r", "x", 1)
    ledger.subscribe("h1", "k", "r", 1)
    with pytest.raises(Conflict, match="subscribed on host h1, not h2"):
        ledger.subscribe("h2", "k", "r", 1)
    with pytest.raises(Conflict, match="not on host h2"):
        ledger.commit("h2", "k", "r", "x", 1)
    first = ledger.commit("h1", "k", "r", "x", 1)
    assert ledger.commit("h1", "k", "r", "x", 1) == first  # a duplicated request
    with pytest.raises(Conflict, match="holds GPUs for cell x"):
        ledger.commit("h1", "k", "r", "y", 1)
    ledger.check_invariants()


def test_zero_gpus_bind_nothing() -> None:
    ledger = ledger_with(h1=0)
    ledger.subscribe("h1", "k", "r", 0)
    assert ledger.commit("h1", "k", "r", "x", 0).device_ids == ()
    assert ledger.binding("k", "r") is None
    ledger.check_invariants()


def test_a_dead_replica_or_host_gives_its_gpus_back() -> None:
    ledger = ledger_with(h1=2, h2=1)
    ledger.subscribe("h1", "k", "r1", 1)
    ledger.subscribe("h2", "k", "r2", 1)
    held = ledger.commit("h1", "k", "r1", "x", 1).binding
    assert ledger.unsubscribe("k", "r1") == held
    assert ledger.unsubscribe("k", "r1") is None
    assert ledger.host_snapshot("h1") == HostSnapshot(
        "h1", 2, 0, 0, replicas=0, free_gpu_speeds=(1.0, 1.0)
    )

    cut = ledger.commit("h2", "k", "r2", "y", 1).binding
    assert ledger.drop_host("h2") == (cut,)
    assert ledger.drop_host("h2") == ()
    assert ledger.hosts() == ["h1"]
    assert ledger.claim("k", "r2") is None
    assert ledger.totals().committed == 0
    ledger.check_invariants()


def test_remove_kernel_drops_every_replica() -> None:
    ledger = ledger_with(h1=1, h2=1)
    ledger.subscribe("h1", "k", "r1", 1)
    ledger.subscribe("h2", "k", "r2", 1)
    ledger.subscribe("h2", "other", "r", 1)
    held = ledger.commit("h1", "k", "r1", "x", 1).binding
    assert ledger.remove_kernel("k") == (held,)
    assert ledger.totals().demand == 1
    ledger.check_invariants()


def test_a_host_that_loses_a_bound_device_is_over_committed_until_release() -> None:
    ledger = ledger_with(h1=3)
    ledger.subscribe("h1", "k", "r", 2)
    ledger.subscribe("h1", "j", "r", 1)
    ledger.commit("h1", "j", "r", "c", 1)  # device 0
    assert ledger.commit("h1", "k", "r", "x", 2).device_ids == ("1", "2")

    assert ledger.set_host("h1", ["0", "1"]) == ("2",)
    assert ledger.set_host("h1", ["0", "1"]) == ()  # reported again: not new
    view = ledger.view("h1")
    assert (view.total, view.committed, view.idle) == (2, 2, 0)
    assert view.vanished == ("2",)
    assert view.over_committed
    assert ledger.host_snapshot("h1").gpus_idle == 0
    ledger.check_invariants()

    ledger.set_host("h1", ["0"])
    snapshot = ledger.host_snapshot("h1")
    assert (snapshot.gpus_total, snapshot.gpus_committed, snapshot.gpus_idle) == (1, 1, 0)
    ledger.release("k", cell_id="x")
    view = ledger.view("h1")
    assert (view.vanished, view.over_committed, view.idle) == ((), False, 0)
    ledger.check_invariants()


def test_a_vanished_device_that_comes_back_is_ordinary_again() -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "k", "r", 2)
    ledger.commit("h1", "k", "r", "x", 2)
    ledger.set_host("h1", ["0"])
    assert ledger.view("h1").vanished == ("1",)
    ledger.set_host("h1", ["0", "1"])
    view = ledger.view("h1")
    assert (view.vanished, view.committed) == ((), 2)
    ledger.check_invariants()


def test_warm_devices_are_preferred_and_displacing_them_is_reported() -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "a", "r", 1)
    ledger.subscribe("h1", "b", "r", 1)
    ledger.commit("h1", "a", "r", "1", 1)  # a on 0
    ledger.release("a")  # warm on 0
    assert ledger.view("h1").warm == {"0": ("a", "r")}
    b = ledger.commit("h1", "b", "r", "1", 1)
    assert (b.device_ids, b.displaced) == (("1",), ())  # the cold device first
    ledger.release("b")
    assert ledger.commit("h1", "a", "r", "2", 1).device_ids == ("0",)  # back to its own
    ledger.release("a")
    ledger.subscribe("h1", "b", "r", 2)
    both = ledger.commit("h1", "b", "r", "2", 2)
    assert both.device_ids == ("1", "0")  # own warm device first, then the other's
    assert both.displaced == (("a", "r"),)
    ledger.release("b", warm=False)
    assert ledger.view("h1").warm == {}
    ledger.check_invariants()


def test_a_replica_that_gets_fewer_devices_than_it_is_warm_on_must_move() -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "a", "r", 2)
    ledger.commit("h1", "a", "r", "1", 2)
    ledger.release("a")
    one = ledger.commit("h1", "a", "r", "2", 1)
    assert (one.device_ids, one.moved) == (("0",), True)
    assert ledger.view("h1").warm == {"0": ("a", "r")}
    ledger.release("a")
    ledger.mark_cold("a", "r")
    assert ledger.view("h1").warm == {}


def test_view_to_dict_is_the_admin_model() -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "k", "r1", 1)
    ledger.subscribe("h1", "k", "r2", 1)
    ledger.commit("h1", "k", "r1", "cell", 1)
    assert ledger.view("h1").to_dict() == {
        "total": 2,
        "subscribed": 1,
        "committed": 1,
        "idle": 1,
        "devices": ["0", "1"],
        "committed_devices": {"0": {"kernel": "k", "replica": "r1", "cell": "cell"}},
        "vanished": [],
        "over_committed": False,
        "warm": {"0": {"kernel": "k", "replica": "r1"}},
    }
    assert ledger.snapshot(alive=lambda host_id: False) == (
        HostSnapshot("h1", 2, 2, 1, replicas=2, alive=False, free_gpu_speeds=(1.0,)),
    )


def test_bad_host_reports_are_refused() -> None:
    ledger = GpuLedger()
    with pytest.raises(InvalidRequest, match="duplicate or empty"):
        ledger.set_host("h1", ["0", "0"])
    with pytest.raises(InvalidRequest):
        ledger.set_host("h1", [""])
    ledger.set_host("h1", ["0"])
    with pytest.raises(InvalidRequest, match="non-negative integer"):
        ledger.subscribe("h1", "k", "r", True)
    with pytest.raises(NotFound):
        ledger.view("nope")


def test_holds_for_tool_workers_are_exclusive_never_lent_and_outlive_the_kernel() -> None:
    ledger = ledger_with(h1=2, h2=3)
    ledger.subscribe("h1", "k", "r", 1)
    ledger.commit("h1", "k", "r", "c", 1)
    ledger.lend("h2", ["0"], "job-a")
    assert ledger.holdable("h1") == ("1",)
    assert ledger.holdable("h2") == ("1", "2", "0")  # lent last
    with pytest.raises(Conflict, match="runs no replica"):
        ledger.hold("h2", ["1"], "nobody", "g0")
    with pytest.raises(Conflict, match="bound to a cell"):
        ledger.hold("h1", ["0"], "k", "g1")
    assert ledger.hold("h2", ["1", "0"], "k", "g1") == ("job-a",)  # the loan ends: cells first
    assert ledger.lent("h2") == {}
    assert ledger.holds("g1") == {"h2": ("0", "1")}
    with pytest.raises(Conflict, match="held for other workers"):
        ledger.hold("h2", ["1"], "k", "g2")
    with pytest.raises(Conflict, match="held for tool workers"):
        ledger.lend("h2", ["1"], "job-b")
    assert ledger.lendable("h2") == ("2",)
    # held devices are taken, for cells and for policies alike
    assert ledger.view("h2").committed == 2
    assert ledger.host_snapshot("h2").free_gpu_speeds == (1.0,)
    ledger.subscribe("h2", "j", "r", 3)
    with pytest.raises(GpusUnavailable, match="1 of 3"):
        ledger.commit("h2", "j", "r", "c", 2)
    assert ledger.commit("h2", "j", "r", "c", 1).device_ids == ("2",)
    ledger.check_invariants()

    assert ledger.unhold("g1") == {"h2": ("0", "1")}
    assert ledger.unhold("g1") == {}
    ledger.hold("h2", ["0"], "k", "g2")
    ledger.unsubscribe("j", "r")
    assert ledger.holds("g2") == {"h2": ("0",)}  # another kernel's replica went: kept
    ledger.hold("h2", ["1", "2"], "k", "g2")
    ledger.remove_kernel("k")
    # the kernel went, but its workers may still run: held until they are known gone
    assert ledger.holds("g2") == {"h2": ("0", "1", "2")}
    assert ledger.holdable("h2") == ()
    ledger.check_invariants()
    assert ledger.unhold("g2", "h1", ["0"]) == {}  # another host's: nothing
    assert ledger.unhold("g2", "h2", ["2", "0"]) == {"h2": ("0", "2")}  # one worker's
    assert ledger.holds("g2") == {"h2": ("1",)}
    assert ledger.unhold("g2") == {"h2": ("1",)}
    ledger.check_invariants()


def test_holds_go_with_their_host_and_with_devices_it_stops_reporting() -> None:
    ledger = ledger_with(h1=1, h2=2)
    ledger.subscribe("h1", "k", "r", 1)
    ledger.hold("h2", ["0", "1"], "k", "g")
    ledger.set_host("h2", ["0"])
    assert ledger.holds("g") == {"h2": ("0",)}
    ledger.drop_host("h2")
    assert ledger.holds("g") == {}
    ledger.check_invariants()


@pytest.mark.parametrize(
    ("corrupt", "breach"),
    [
        (lambda led: led._claims.pop(("k", "r")), "not subscribed on its host"),
        (
            lambda led: led._bindings.__setitem__(("j", "r"), Binding("h1", "j", "r", "c", ("0",))),
            "bound twice",
        ),
        (lambda led: led._hosts["h1"].__setattr__("devices", ("1",)), "neither has nor lists"),
        (lambda led: led._hosts["h1"].vanished.add("1"), "both present and vanished"),
        (lambda led: led._hosts["h1"].warm.__setitem__("1", ("x", "y")), "not subscribed there"),
        (lambda led: led._hosts.pop("h1"), "unknown host"),
        (
            lambda led: led._hosts["h1"].held.__setitem__("0", WorkerHold("k", "g")),
            "held for .* bound or lent too",
        ),
    ],
)
def test_check_invariants_names_the_breach(corrupt, breach: str) -> None:
    ledger = ledger_with(h1=2)
    ledger.subscribe("h1", "k", "r", 1)
    ledger.subscribe("h1", "j", "r", 1)
    ledger.commit("h1", "k", "r", "c", 1)
    ledger.check_invariants()
    corrupt(ledger)
    with pytest.raises(LedgerInconsistent, match=breach) as raised:
        ledger.check_invariants()
    assert raised.value.reason == "ledger-inconsistent"


# ---- random event sequences ----------------------------------------------------------------

HOSTS = ("h1", "h2", "h3")
KERNELS = ("k1", "k2", "k3", "k4")
REPLICAS = ("r1", "r2", "r3")


def random_event(rng: random.Random, ledger: GpuLedger, cells: list[int]) -> None:
    """One event a gateway could cause; domain errors are legitimate answers. Most events act
    on what exists (known hosts, subscribed replicas, held bindings) so that deep states are
    reached; the rest are arbitrary."""
    kind = rng.choices(
        [
            "host",
            "drop",
            "subscribe",
            "unsubscribe",
            "commit",
            "release",
            "cold",
            "kernel",
            "hold",
            "unhold",
            "lend",
        ],
        weights=[3, 1, 6, 2, 8, 6, 1, 1, 3, 2, 2],
    )[0]
    host, kernel, replica = rng.choice(HOSTS), rng.choice(KERNELS), rng.choice(REPLICAS)
    keys = [(k, r) for k in KERNELS for r in REPLICAS]
    claims = [claim for claim in (ledger.claim(*key) for key in keys) if claim is not None]
    bindings = [binding for binding in (ledger.binding(*key) for key in keys) if binding]
    sensible = rng.random() < 0.85
    if kind == "subscribe" and sensible and ledger.hosts():
        host = rng.choice(ledger.hosts())
    elif kind == "commit" and sensible and claims:
        idle = [c for c in claims if ledger.binding(c.kernel_id, c.replica_id) is None]
        claim = rng.choice(idle or claims)
        host, kernel, replica = claim.host_id, claim.kernel_id, claim.replica_id
    elif kind in ("release", "unsubscribe", "cold") and sensible and bindings:
        binding = rng.choice(bindings)
        host, kernel, replica = binding.host_id, binding.kernel_id, binding.replica_id

    if kind == "host":  # register, grow or shrink, in any order of ids
        devices = rng.sample([str(i) for i in range(5)], rng.randint(0, 4))
        vanished = ledger.set_host(host, devices)
        assert all(device not in devices for device in vanished)
    elif kind == "drop":
        cut = ledger.drop_host(host)
        assert all(binding.host_id == host for binding in cut)
        assert host not in ledger.hosts()
    elif kind == "subscribe":
        ledger.subscribe(host, kernel, replica, rng.randint(0, 3))
    elif kind == "unsubscribe":
        ledger.unsubscribe(kernel, replica)
        assert ledger.claim(kernel, replica) is None
        assert ledger.binding(kernel, replica) is None
    elif kind == "commit":
        gpus = rng.randint(0, 2)
        held = ledger.binding(kernel, replica) is not None
        free_before = ledger.view(host).idle if host in ledger.hosts() else 0
        cells[0] += 1
        commitment = ledger.commit(host, kernel, replica, f"c{cells[0]}", gpus)
        assert not held, "a replica holding GPUs for another cell must be refused"
        assert len(commitment.device_ids) == gpus
        assert set(commitment.device_ids) <= set(ledger.view(host).device_ids)
        assert ledger.view(host).idle == free_before - gpus
    elif kind == "release":
        binding = ledger.binding(kernel, replica)
        cell = rng.choice([None, binding.cell_id if binding else "c0"])
        only = rng.choice([None, replica])
        warm = rng.random() < 0.7
        for released in ledger.release(kernel, cell_id=cell, replica_id=only, warm=warm):
            assert ledger.binding(released.kernel_id, released.replica_id) is None
    elif kind == "cold":
        ledger.mark_cold(kernel, replica)
    elif kind == "hold":
        if sensible and ledger.hosts():
            host = rng.choice(ledger.hosts())
        free = list(ledger.holdable(host))
        devices = rng.sample(free, min(len(free), rng.randint(1, 2))) if sensible else ["0"]
        group = rng.choice(["g1", "g2", "g3"])
        ledger.hold(host, devices, kernel, f"{kernel}-{group}")
        assert all(ledger.held(host)[d].group_id == f"{kernel}-{group}" for d in devices)
        assert not set(devices) & set(ledger.lent(host))
    elif kind == "unhold":
        group = f"{kernel}-{rng.choice(['g1', 'g2', 'g3'])}"
        ledger.unhold(group)
        assert ledger.holds(group) == {}
    elif kind == "lend":
        lendable = ledger.lendable(host) if host in ledger.hosts() else ()
        ledger.lend(host, lendable[:1] if sensible else ["0"], rng.choice(["j1", "j2"]))
    else:
        ledger.remove_kernel(kernel)


def check(ledger: GpuLedger) -> None:
    ledger.check_invariants()
    for host_id in ledger.hosts():
        view = ledger.view(host_id)
        assert 0 <= view.committed <= view.total
        assert view.idle >= 0
        assert view.subscribed >= 0
        snapshot = ledger.host_snapshot(host_id)
        assert snapshot.gpus_idle == view.idle
    totals = ledger.totals()
    assert 0 <= totals.committed <= totals.total
    assert 0 <= totals.subscribed <= totals.demand


@pytest.mark.parametrize("seed", range(40))
def test_random_events_keep_the_ledger_consistent(seed: int) -> None:
    rng = random.Random(seed)
    ledger = GpuLedger()
    cells = [0]
    answered = 0
    for _ in range(250):
        try:
            random_event(rng, ledger, cells)
            answered += 1
        except LedgerInconsistent:
            raise
        except FleetError:
            pass  # refused cleanly: not enough GPUs, not subscribed, unknown host, ...
        check(ledger)
    assert answered > 100, "most events should be legal"
    for host_id in ledger.hosts():
        ledger.drop_host(host_id)
    assert ledger.totals() == ledger.totals().__class__(0, 0, 0, 0)
    check(ledger)


def test_a_checked_ledger_audits_every_change_and_counts_each_breach_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []
    ledger = GpuLedger(checked=True, on_breach=seen.append)
    ledger.set_host("h1", ["0", "1"])
    ledger.subscribe("h1", "k", "r1", 1)
    ledger.commit("h1", "k", "r1", "c1", 1)
    assert ledger.set_host("h1", ["1"]) == ("0",)  # vanishing under a cell is no breach
    with pytest.raises(Conflict):
        ledger.commit("h1", "k", "r2", "c2", 1)  # refused calls are audited too
    ledger.release("k")
    ledger.remove_kernel("k")  # audited once, after the outermost call
    assert (ledger.breaches, seen) == (0, [])

    ledger.subscribe("h1", "k", "r1", 1)
    ledger._hosts["h1"].vanished.add("7")  # what a bug in a mutating method would leave
    with caplog.at_level("ERROR", logger="kernelfleet.gateway.ledger"):
        ledger.mark_cold("k", "r1")
        ledger.subscribe("h1", "k", "r1", 2)  # the same breach: logged and counted once
    breach = "device 7 of host h1 is listed as vanished but bound to nobody"
    assert ledger.breaches == 1
    assert seen == [f"GPU ledger invariant broken: {breach}"]
    assert caplog.text.count(breach) == 1
    assert "after mark_cold('k', 'r1'): GPU ledger invariant broken" in caplog.text

    ledger._hosts["h1"].vanished.clear()
    ledger.unsubscribe("k", "r1")  # consistent again: the next breach counts anew
    ledger._hosts["h1"].warm["1"] = ("k", "r1")
    ledger.set_host("h1", ["0", "1"])
    assert ledger.breaches == 2
    assert "warm for ('k', 'r1')" in seen[-1]


def test_an_unchecked_ledger_does_not_audit() -> None:
    ledger = ledger_with(h1=1)
    ledger._hosts["h1"].vanished.add("7")
    ledger.subscribe("h1", "k", "r1", 1)
    assert ledger.breaches == 0
    with pytest.raises(LedgerInconsistent, match="device 7"):
        ledger.check_invariants()


def test_every_release_is_told_to_the_release_listeners_once() -> None:
    """Whatever releases a binding (its cell's end, its replica or kernel going, its host
    dropped), listeners hear of it once; a listener that fails does not stop the ledger."""
    ledger = ledger_with(h1=2, h2=1)
    heard: list[Binding] = []

    def broken(binding: Binding) -> None:
        raise RuntimeError("a listener's bug")

    ledger.on_release(broken)
    ledger.on_release(heard.append)
    for replica, host in (("r1", "h1"), ("r2", "h1"), ("r3", "h2")):
        ledger.subscribe(host, "k", replica, 1)
    ledger.subscribe("h1", "k2", "r4", 1)
    cell = ledger.commit("h1", "k", "r1", "cell-1", 1).binding
    ledger.release("k", cell_id="cell-1")
    ledger.release("k", cell_id="cell-1")
    gone = ledger.commit("h1", "k", "r2", "cell-2", 1).binding
    ledger.unsubscribe("k", "r2")
    lost = ledger.commit("h2", "k", "r3", "cell-3", 1).binding
    ledger.drop_host("h2")
    shut = ledger.commit("h1", "k2", "r4", "cell-4", 1).binding
    ledger.remove_kernel("k2")
    assert ledger.commit("h1", "k", "r1", "cell-5", 0).device_ids == ()
    assert heard == [cell, gone, lost, shut]
    ledger.check_invariants()
