"""Local host agents started and stopped by the provider and the autoscaler, against a real
gateway (subprocesses, real registration and heartbeats)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelfleet.errors import HostLimitReached, HostUnavailable, InvalidRequest, NotFound
from kernelfleet.gateway.autoscaler import Autoscaler
from kernelfleet.gateway.host_provider import LocalProcessHostProvider
from kernelfleet.gateway.metrics import FleetMetrics
from kernelfleet.runtime_file import RUNTIME_FILE
from kernelfleet.scheduler import AutoscaleConfig, FleetSnapshot, HostSnapshot, ScaleIn, ScaleOut
from kernelfleet.scheduler.policies import NotebookOSPolicy
from kernelfleet.testing import TOKEN, Fleet, exited_pid, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture
def small_fleet(private_fleet: Callable[..., Fleet]) -> Fleet:
    """A gateway that marks a host lost after 1.5 s of silence, and one hand-started host."""
    return private_fleet(hosts=1, gpus=1, gateway_args=["--GatewayApp.heartbeat_timeout=1.5"])


def hosts_of(fleet: Fleet) -> dict[str, dict]:
    return {host["id"]: host for host in fleet.api("GET", "/api/fleet/hosts")}


async def test_the_autoscaler_adds_a_host_under_demand_and_removes_it_when_idle(
    small_fleet: Fleet, tmp_path: Path
) -> None:
    fleet = small_fleet
    provider = LocalProcessHostProvider(
        fleet.url, fleet.token, tmp_path / "provided", gpus_per_host=1, max_hosts=1
    )
    waiting = {"gpus": 2}

    def snapshot() -> FleetSnapshot:
        hosts = tuple(
            HostSnapshot(
                host["id"],
                host["gpus"]["total"],
                host["gpus"]["subscribed"],
                host["gpus"]["committed"],
                alive=host["state"] == "alive",
            )
            for host in hosts_of(fleet).values()
        )
        return FleetSnapshot(hosts=hosts, gpus_waiting=waiting["gpus"])

    drained: list[str] = []

    async def drain(host_id: str) -> None:
        drained.append(host_id)

    metrics = FleetMetrics()
    config = AutoscaleConfig(headroom=1.0, buffer_hosts=0, min_hosts=1)
    scaler = Autoscaler(
        snapshot,
        NotebookOSPolicy(config),
        provider,
        drain,
        cooldown=0,
        metrics=metrics,
        hosts=HeartbeatsTell(),
    )
    try:
        grown = await scaler.run_once()
        assert grown.decision == ScaleOut(1)
        assert grown.started == ("auto-1",)
        added = await wait_until(
            lambda: hosts_of(fleet).get("auto-1", {}).get("state") == "alive",
            10,
            "auto-1 to register",
        )
        assert added
        assert hosts_of(fleet)["auto-1"]["gpus"]["total"] == 1
        assert (tmp_path / "provided" / "logs" / "auto-1.log").exists()
        with pytest.raises(HostLimitReached):
            await provider.start_host()

        assert (await scaler.run_once()).started == ()  # 2 hosts for 2 GPUs: enough
        process = provider.process("auto-1")
        waiting["gpus"] = 0
        shrunk = await scaler.run_once()
        assert shrunk.decision == ScaleIn(("auto-1",))
        assert shrunk.stopped == ("auto-1",)
        assert drained == ["auto-1"]
        assert provider.hosts() == ()
        assert process.poll() is not None
        await wait_until(
            lambda: hosts_of(fleet)["auto-1"]["state"] == "lost", 10, "auto-1 to be lost"
        )
        assert hosts_of(fleet)["host-1"]["state"] == "alive"
        assert metrics.registry.get_sample_value("kernelfleet_scale_out_hosts_total") == 1
        assert metrics.registry.get_sample_value("kernelfleet_scale_in_hosts_total") == 1
        assert (await scaler.run_once()).stopped == ()
    finally:
        await provider.close()


class HeartbeatsTell:
    """Tells the gateway nothing of a stopped host: it finds out when the heartbeats stop."""

    def stopping(self, host_id: str) -> None:
        pass

    def forget(self, host_id: str) -> None:
        pass


async def test_a_host_that_cannot_start_is_reported_with_its_log(
    small_fleet: Fleet, tmp_path: Path
) -> None:
    provider = LocalProcessHostProvider(
        small_fleet.url, small_fleet.token, tmp_path / "bad", extra_args=["--port", "99999"]
    )
    with pytest.raises(HostUnavailable, match="exited with code") as failed:
        await provider.start_host()
    assert "port must be between 0 and 65535" in failed.value.message
    assert provider.hosts() == ()
    with pytest.raises(NotFound):
        await provider.stop_host("auto-1")


@pytest.mark.parametrize("writer", ["a killed agent", "a process still running"])
async def test_a_runtime_file_left_in_the_state_dir_is_not_taken_for_the_new_agent(
    tmp_path: Path, writer: str
) -> None:
    """The new agent fails at start-up; a runtime file already there (an earlier agent's, or
    one naming a live pid that is not the new agent) must not make it look started."""
    pid = exited_pid() if writer == "a killed agent" else os.getpid()
    (tmp_path / "auto-1").mkdir()
    runtime = {"host_id": "auto-1", "address": "http://127.0.0.1:9", "port": 9, "pid": pid}
    (tmp_path / "auto-1" / RUNTIME_FILE).write_text(json.dumps(runtime))
    provider = LocalProcessHostProvider(
        "http://127.0.0.1:9", TOKEN, tmp_path, extra_args=["--port", "99999"]
    )
    with pytest.raises(HostUnavailable, match="exited with code"):
        await provider.start_host()
    assert provider.hosts() == ()


async def test_a_spot_provider_starts_agents_that_say_they_are_spot(
    small_fleet: Fleet, tmp_path: Path
) -> None:
    provider = LocalProcessHostProvider(
        small_fleet.url, small_fleet.token, tmp_path / "spot", kind="spot"
    )
    try:
        host_id = await provider.start_host()
        await wait_until(lambda: host_id in hosts_of(small_fleet), 30, f"{host_id} to register")
        assert hosts_of(small_fleet)[host_id]["kind"] == "spot"
    finally:
        await provider.close()
    with pytest.raises(InvalidRequest, match="the host provider's kind must be one of"):
        LocalProcessHostProvider(small_fleet.url, small_fleet.token, tmp_path / "x", kind="cheap")
