"""The replica state machine, request validation, host-id storage, and port retries."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets import TraitError

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.agent.app import load_or_create_host_id
from kernelfleet.kernels.agent.replicas import (
    Replica,
    ReplicaRequest,
    ReplicaState,
    parse_timeout,
)
from kernelfleet.states import IllegalTransition

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


async def test_a_port_taken_before_the_kernel_binds_it_is_replaced(
    tmp_path: Path, monkeypatch
) -> None:
    """Another process may take a chosen port before the kernel binds it: the launch fails
    with EADDRINUSE and is retried with fresh ports (a real ipykernel)."""
    import socket

    from jupyter_client.kernelspec import KernelSpecManager

    from kernelfleet.kernels.agent import replicas as module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real, handed = module.free_ports, []

    def first_with_a_taken_port(ip, count, avoid=frozenset()):
        ports = real(ip, count, avoid)
        if not handed:
            ports[1] = port  # the iopub port
        handed.append(ports)
        return ports

    monkeypatch.setattr(module, "free_ports", first_with_a_taken_port)
    table = module.ReplicaTable(
        state_dir=tmp_path, kernel_spec_manager=KernelSpecManager(), root_dir=tmp_path
    )
    try:
        replica = await table.start(ReplicaRequest("r", "k", "python3"))
        assert replica.state is ReplicaState.READY
        assert len(handed) == 2, "a second set of ports after the failed launch"
        assert port not in replica.ports
        assert "Address already in use" in replica.log_path.read_text()
    finally:
        await table.stop_all(grace=5)
        taken.close()


async def test_a_raft_port_taken_before_the_replica_holds_it_is_replaced(
    tmp_path: Path, monkeypatch
) -> None:
    """A replicated kernel binds its Raft port as it starts, to hold it until it joins its
    group; another agent's replica that took the port first makes it fail at once with
    EADDRINUSE, and it is launched again on fresh ports (a real ReplicatedKernel)."""
    import socket

    from jupyter_client.kernelspec import KernelSpecManager

    from kernelfleet.kernels.agent import replicas as module
    from kernelfleet.kernels.agent.app import PACKAGED_KERNELSPECS

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    real, raft_ports = module.free_ports, []

    def first_raft_port_taken(ip, count, avoid=frozenset()):
        ports = real(ip, count, avoid)
        if count == 1:  # the Raft port
            ports = [port] if not raft_ports else ports
            raft_ports.append(ports[0])
        return ports

    monkeypatch.setattr(module, "free_ports", first_raft_port_taken)
    specs = KernelSpecManager()
    specs.kernel_dirs.append(str(PACKAGED_KERNELSPECS))
    table = module.ReplicaTable(state_dir=tmp_path, kernel_spec_manager=specs, root_dir=tmp_path)
    try:
        request = ReplicaRequest("r", "k", "kernelfleet-python3", raft=True)
        replica = await table.start(request)
        assert replica.state is ReplicaState.READY
        assert raft_ports[0] == port
        assert len(raft_ports) == 2, "a fresh Raft port after the failed launch"
        assert replica.raft_address == f"127.0.0.1:{raft_ports[1]}"
        assert "Address already in use" in replica.log_path.read_text()
        with socket.socket() as probe, pytest.raises(OSError, match="Address already in use"):
            probe.bind(("127.0.0.1", raft_ports[1]))  # held for the replica
    finally:
        await table.stop_all(grace=5)
        taken.close()


async def test_starts_that_retry_ports_never_terminate_a_zmq_context_on_the_event_loop(
    tmp_path: Path, monkeypatch
) -> None:
    """Terminating a ZMQ context blocks until libzmq has wound down every connection, which
    took seconds for one to a port another kernel's socket held: the agent then answered no
    link ping and the gateway declared its host lost. Concurrent starts, two of them on a
    port a foreign ZMQ socket holds, terminate no context (real ReplicatedKernels)."""
    import asyncio

    import zmq
    from jupyter_client.kernelspec import KernelSpecManager

    from kernelfleet.kernels.agent import replicas as module
    from kernelfleet.kernels.agent.app import PACKAGED_KERNELSPECS

    foreign = zmq.Context()
    held = []
    real, calls = module.free_ports, []

    def shell_port_held_by_another_kernel(ip, count, avoid=frozenset()):
        ports = real(ip, count, avoid)
        calls.append(count)
        if count > 1 and len(held) < 2:
            socket = foreign.socket(zmq.ROUTER)
            ports[0] = socket.bind_to_random_port(f"tcp://{ip}")
            held.append(socket)
        return ports

    terminated = []
    real_term = zmq.Context.term

    def recording_term(context):
        terminated.append(context)
        real_term(context)

    monkeypatch.setattr(module, "free_ports", shell_port_held_by_another_kernel)
    monkeypatch.setattr(zmq.Context, "term", recording_term)
    specs = KernelSpecManager()
    specs.kernel_dirs.append(str(PACKAGED_KERNELSPECS))
    table = module.ReplicaTable(state_dir=tmp_path, kernel_spec_manager=specs, root_dir=tmp_path)
    try:
        requests = [
            ReplicaRequest(f"r{n}", f"k{n}", "kernelfleet-python3", raft=True) for n in range(3)
        ]
        started = await asyncio.gather(*(table.start(request) for request in requests))
        assert [replica.state for replica in started] == [ReplicaState.READY] * 3
        assert len(held) == 2
        assert calls.count(5) == 5, "two starts retried with new ports"
        assert terminated == []
    finally:
        await table.stop_all(grace=5)
        for socket in held:
            socket.close(linger=0)
        foreign.term()
