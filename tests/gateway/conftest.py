"""Fixtures shared by the gateway's live tests."""

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from jupyter_server.gateway.gateway_client import GatewayClient

from kernelfleet.testing import TOKEN, Fleet, descendants, kill_all
from kernelfleet.testing.netns import NamespacesUnavailable, Topology, build_topology, start_host_in

HOSTS = 3


@pytest.fixture
def jp_server_config(fleet):
    """A real jupyter_server in gateway mode, pointed at the shared fleet, with our extension."""
    return {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {"url": fleet.url, "auth_token": fleet.token, "request_timeout": 60.0},
    }


@pytest.fixture(autouse=True)
def _fresh_gateway_client():
    yield
    GatewayClient.clear_instance()


@dataclass
class Partitioned:
    fleet: Fleet
    topology: Topology


@pytest.fixture
def partitioned(tmp_path) -> Iterator[Partitioned]:
    """A gateway in the root namespace and one host agent in each of 3 namespaces."""
    try:
        topology = build_topology(HOSTS)
    except NamespacesUnavailable as e:
        pytest.skip(f"network namespaces: {e}")
    fleet = Fleet(state_dir=tmp_path / "fleet", token=TOKEN, env={}, ip=topology.gateway_ip)
    fleet.state_dir.mkdir()
    below: set[int] = set()
    try:
        fleet.gateway_args = ("--replicas", "3")
        fleet.start_gateway(*fleet.gateway_args)
        for i in range(1, HOSTS + 1):
            start_host_in(fleet, topology, i)
        yield Partitioned(fleet, topology)
    finally:
        for process in fleet.hosts.values():
            below.update(descendants(process.pid))
        fleet.stop()
        kill_all(below)  # replicas that outlived their agent
        topology.destroy()
