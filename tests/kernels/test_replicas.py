"""The replica state machine, request validation and host-id storage (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets import TraitError

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.agent import load_or_create_host_id
from kernelfleet.kernels.replicas import (
    IllegalTransition,
    Replica,
    ReplicaRequest,
    ReplicaState,
    parse_timeout,
)

S = ReplicaState
LEGAL = {
    (S.STARTING, S.READY),
    (S.STARTING, S.DEAD),
    (S.STARTING, S.STOPPED),
    (S.READY, S.RESTARTING),
    (S.READY, S.DEAD),
    (S.READY, S.STOPPED),
    (S.RESTARTING, S.READY),
    (S.RESTARTING, S.DEAD),
    (S.RESTARTING, S.STOPPED),
    (S.DEAD, S.RESTARTING),
    (S.DEAD, S.STOPPED),
}


def replica_in(state: ReplicaState) -> Replica:
    request = ReplicaRequest(replica_id="r", kernel_id="k", kernel_name="python3")
    replica = Replica(request, km=None, directory=Path("/nonexistent"), launch_timeout=1.0)  # type: ignore[arg-type]
    replica.state = state
    return replica


@pytest.mark.parametrize("source", list(ReplicaState))
@pytest.mark.parametrize("target", list(ReplicaState))
def test_transition_table(source: ReplicaState, target: ReplicaState) -> None:
    replica = replica_in(source)
    if (source, target) in LEGAL:
        replica.move_to(target)
        assert replica.state is target
    else:
        with pytest.raises(IllegalTransition, match=f"{source.value} -> {target.value}"):
            replica.move_to(target)
        assert replica.state is source


def test_request_from_json() -> None:
    request = ReplicaRequest.from_json(
        {
            "replica_id": "r-1.a_b",
            "kernel_id": "k",
            "kernel_name": "python3",
            "env": {"A": "1"},
            "launch_timeout": 12,
            "something_new": True,
        }
    )
    assert request == ReplicaRequest("r-1.a_b", "k", "python3", {"A": "1"}, 12.0)
    assert (
        ReplicaRequest.from_json(
            {"replica_id": "r", "kernel_id": "k", "kernel_name": "n", "env": None}
        ).env
        == {}
    )


@pytest.mark.parametrize(
    "body",
    [
        {"kernel_id": "k", "kernel_name": "n"},
        {"replica_id": "", "kernel_id": "k", "kernel_name": "n"},
        {"replica_id": "a/b", "kernel_id": "k", "kernel_name": "n"},
        {"replica_id": ".hidden", "kernel_id": "k", "kernel_name": "n"},
        {"replica_id": "r", "kernel_id": 5, "kernel_name": "n"},
        {"replica_id": "r", "kernel_id": "k"},
        {"replica_id": "r", "kernel_id": "k", "kernel_name": "n", "env": ["A"]},
        {"replica_id": "r", "kernel_id": "k", "kernel_name": "n", "launch_timeout": 0},
        {"replica_id": "r", "kernel_id": "k", "kernel_name": "n", "launch_timeout": True},
        {"replica_id": "r", "kernel_id": "k", "kernel_name": "n", "launch_timeout": "nan"},
    ],
)
def test_request_rejects(body: dict) -> None:
    with pytest.raises(InvalidRequest):
        ReplicaRequest.from_json(body)


def test_parse_timeout() -> None:
    assert parse_timeout(None, "t") is None
    assert parse_timeout("2.5", "t") == 2.5
    with pytest.raises(InvalidRequest, match="'t'"):
        parse_timeout("inf", "t")


def test_host_id_is_created_once_and_kept(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    first = load_or_create_host_id(state_dir)
    assert first.startswith("host-")
    assert len(first) == len("host-") + 8
    assert load_or_create_host_id(state_dir) == first
    assert (state_dir / "host-id").read_text().strip() == first
    (state_dir / "host-id").write_text("not a valid id!\n")
    with pytest.raises(TraitError, match="not a valid host id"):
        load_or_create_host_id(state_dir)
