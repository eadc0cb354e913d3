"""The agent's GPU settings: owners, resets when a replica exits, the state file a restarted
agent resets from (`GpuSettings`), and the agent API over a real agent subprocess."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kernelfleet.errors import Conflict, InvalidRequest, PermissionDenied
from kernelfleet.kernels.agent.gpu_control import NvmlGpuControl, VirtualGpuControl
from kernelfleet.kernels.agent.gpu_settings import STATE_FILE, GpuSettings, Owner
from kernelfleet.kernels.agent.gpus import GpuDevice, VirtualInventory
from kernelfleet.testing import wait_until

from .conftest import AgentProcess
from .fake_pynvml import FakeGpu, FakeNvml

UUIDS = ["GPU-virtual-h-0", "GPU-virtual-h-1"]
CELL = Owner("k1", "cell-1", "r1")


class Replicas:
    """The replica ids a test says run on the host."""

    def __init__(self, *ids: str) -> None:
        self.live = set(ids)

    def __call__(self) -> set[str]:
        return set(self.live)


def settings_over(control, tmp_path: Path, replicas: Replicas) -> GpuSettings:
    return GpuSettings(control, tmp_path, replicas)


def virtual() -> VirtualGpuControl:
    return VirtualGpuControl(VirtualInventory(2, "h").devices())


def test_a_change_is_owned_written_down_and_reset_by_its_kernel(tmp_path: Path) -> None:
    control, replicas = virtual(), Replicas("r1")
    gpus = settings_over(control, tmp_path, replicas)
    gpus.apply(UUIDS[:1], CELL, {"power_limit_w": 250})
    model = gpus.read(UUIDS)
    assert model[0]["current"]["power_limit_w"] == 250
    assert model[0]["owner"] == {
        "kernel_id": "k1",
        "binding": "cell-1",
        "replica_id": "r1",
    }
    assert model[1]["owner"] is None
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["devices"] == {
        UUIDS[0]: {"owner": CELL.to_dict(), "changed": {"power_limit_w": 250.0}}
    }
    assert gpus.reset(kernel_id="k2") == [], "another kernel's reset leaves it alone"
    assert gpus.reset(kernel_id="k1", binding="cell-2") == []
    reset = gpus.reset(kernel_id="k1", binding="cell-1")
    assert reset[0]["calls"] == ["nvmlDeviceSetPowerManagementLimit(0, 400000)"]
    assert gpus.read(UUIDS[:1])[0]["current"]["power_limit_w"] == 400.0
    assert json.loads((tmp_path / STATE_FILE).read_text())["devices"] == {}


def test_the_replicas_exit_resets_its_devices(tmp_path: Path) -> None:
    control, replicas = virtual(), Replicas("r1", "r2")
    gpus = settings_over(control, tmp_path, replicas)
    gpus.apply(UUIDS[:1], CELL, {"gpu_clock_mhz": 900})
    gpus.apply(UUIDS[1:], Owner("k2", "cell-9", "r2"), {"gpu_clock_mhz": 600})
    replicas.live.discard("r1")
    gpus.replicas_changed()
    assert control.changed(UUIDS[0]) == {}, "r1 is gone"
    assert control.changed(UUIDS[1]) == {"gpu_clock_mhz": 600}, "r2 still runs"
    assert control.calls[-1] == "nvmlDeviceResetGpuLockedClocks(0)"


def test_a_replica_that_does_not_run_here_cannot_change_anything(tmp_path: Path) -> None:
    gpus = settings_over(virtual(), tmp_path, Replicas())
    with pytest.raises(Conflict, match="does not run on this host"):
        gpus.apply(UUIDS, CELL, {"power_limit_w": 200})
    with pytest.raises(InvalidRequest, match="no GPU"):
        gpus.apply(["GPU-elsewhere"], Owner("k1", "c"), {"power_limit_w": 200})


def test_a_device_left_by_another_owner_is_reset_before_the_new_change(tmp_path: Path) -> None:
    control = virtual()
    gpus = settings_over(control, tmp_path, Replicas("r1", "r2"))
    gpus.apply(UUIDS[:1], CELL, {"gpu_clock_mhz": 900, "power_limit_w": 200})
    gpus.apply(UUIDS[:1], Owner("k2", "cell-5", "r2"), {"power_limit_w": 300})
    assert control.changed(UUIDS[0]) == {"power_limit_w": 300.0}, "the old clock lock went"
    assert gpus.read(UUIDS[:1])[0]["owner"]["kernel_id"] == "k2"


def test_a_dry_run_neither_changes_nor_owns(tmp_path: Path) -> None:
    control = virtual()
    gpus = settings_over(control, tmp_path, Replicas("r1"))
    planned = gpus.apply(UUIDS, CELL, {"power_limit_w": 200}, dry_run=True)
    assert [d["calls"] for d in planned] == [
        ["nvmlDeviceSetPowerManagementLimit(0, 200000)"],
        ["nvmlDeviceSetPowerManagementLimit(1, 200000)"],
    ]
    assert control.calls == []
    assert gpus.read(UUIDS)[0]["owner"] is None


def test_a_refusal_leaves_nothing_owned_or_changed(tmp_path: Path) -> None:
    control = VirtualGpuControl(VirtualInventory(2, "h").devices(), permitted=False)
    gpus = settings_over(control, tmp_path, Replicas("r1"))
    with pytest.raises(PermissionDenied):
        gpus.apply(UUIDS, CELL, {"power_limit_w": 200})
    assert [d["owner"] for d in gpus.read(UUIDS)] == [None, None]


def test_a_restarted_agent_resets_what_the_state_file_says_with_real_nvml_calls(
    tmp_path: Path,
) -> None:
    nvml = FakeNvml([FakeGpu("GPU-a"), FakeGpu("GPU-b")])
    devices = [GpuDevice(i, u, "A100", 1, virtual=False) for i, u in enumerate(["GPU-a", "GPU-b"])]
    first = settings_over(NvmlGpuControl(devices, nvml), tmp_path, Replicas("r1"))
    first.apply(["GPU-b"], CELL, {"gpu_clock_mhz": 1005, "power_limit_w": 275})
    assert nvml.gpus["GPU-b"].gpu_locked == (1005, 1005)
    nvml.calls.clear()
    # the agent was killed; a new one starts on the same state dir
    again = settings_over(NvmlGpuControl(devices, nvml), tmp_path, Replicas())
    assert again.restore() == ["GPU-b"]
    assert nvml.calls == [
        "nvmlDeviceSetPowerManagementLimit(GPU-b, 400000)",
        "nvmlDeviceResetGpuLockedClocks(GPU-b)",
    ]
    assert nvml.gpus["GPU-b"].gpu_locked is None
    assert json.loads((tmp_path / STATE_FILE).read_text())["devices"] == {}
    assert again.restore() == [], "once"


def test_an_unreadable_state_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    gpus = settings_over(virtual(), tmp_path, Replicas())
    assert gpus.restore() == []
    assert json.loads((tmp_path / STATE_FILE).read_text()) == {"devices": {}}


def test_without_a_control_every_call_says_why(tmp_path: Path) -> None:
    gpus = GpuSettings(None, tmp_path, Replicas(), why="NVML could not be initialised")
    with pytest.raises(Exception, match="cannot change its GPUs' settings: NVML could not"):
        gpus.read(["GPU-a"])


# ---- the agent API, over a real agent ----------------------------------------------------------


async def test_the_agent_api_sets_reads_and_resets_and_a_replicas_exit_resets(
    host_agent,
) -> None:
    agent: AgentProcess = await host_agent(gpus=2)
    client = agent.client
    devices = await client.gpu_settings([])
    uuids = [d["uuid"] for d in devices]
    assert len(uuids) == 2
    assert devices[0]["ranges"]["power_limit_w"] == [100.0, 400.0]
    model = await client.start_replica("r1", "k1", "python3")
    agent.kernel_pids.add(model["pid"])
    owner = {"kernel_id": "k1", "binding": "cell-1", "replica_id": "r1"}
    applied = await client.set_gpu_settings(uuids[:1], owner, {"power_limit_w": 180})
    assert applied[0]["calls"] == ["nvmlDeviceSetPowerManagementLimit(0, 180000)"]
    read = await client.gpu_settings(uuids[:1])
    assert read[0]["current"]["power_limit_w"] == 180
    assert read[0]["owner"] == owner
    with pytest.raises(InvalidRequest, match="outside"):
        await client.set_gpu_settings(uuids[:1], owner, {"power_limit_w": 9000})
    with pytest.raises(Conflict, match="does not run"):
        await client.set_gpu_settings(
            uuids[1:], {**owner, "replica_id": "r9"}, {"gpu_clock_mhz": 900}
        )
    await client.set_gpu_settings(uuids[1:], owner, {"gpu_clock_mhz": 900})
    reset = await client.reset_gpu_settings(uuids[1:], kernel_id="k1", binding="cell-1")
    assert reset[0]["calls"] == ["nvmlDeviceResetGpuLockedClocks(1)"]

    await client.stop_replica("r1")  # the replica exits: its owner's devices go back
    read = await client.gpu_settings(uuids)
    assert [d["owner"] for d in read] == [None, None]
    assert read[0]["current"] == read[0]["default"]


async def test_an_agent_killed_with_settings_changed_resets_them_when_it_starts_again(
    host_agent,
) -> None:
    agent: AgentProcess = await host_agent(gpus=1)
    uuid = (await agent.client.gpu_settings([]))[0]["uuid"]
    owner = {"kernel_id": "k1", "binding": "cell-1"}
    await agent.client.set_gpu_settings([uuid], owner, {"gpu_clock_mhz": 705})
    agent.signal(signal.SIGKILL)
    await agent.wait_exit(10)
    left = json.loads((agent.state_dir / STATE_FILE).read_text())["devices"]
    assert left[uuid]["changed"] == {"gpu_clock_mhz": 705}
    again: AgentProcess = await host_agent(gpus=1, state_dir=agent.state_dir)
    await wait_until(lambda: "previous agent left" in again.log(), 10, "the reset at start")
    assert json.loads((agent.state_dir / STATE_FILE).read_text())["devices"] == {}
    assert (await again.client.gpu_settings([uuid]))[0]["changed"] == {}


async def test_an_agent_that_may_not_set_clocks_answers_403_and_changes_nothing(
    host_agent,
) -> None:
    agent: AgentProcess = await host_agent(
        gpus=1, args=["--HostAgentApp.virtual_gpu_settings_permitted=False"]
    )
    uuid = (await agent.client.gpu_settings([]))[0]["uuid"]
    with pytest.raises(PermissionDenied, match="Insufficient Permissions"):
        await agent.client.set_gpu_settings([uuid], {"kernel_id": "k", "binding": "c"},
                                            {"power_limit_w": 200})  # fmt: skip
    assert (await agent.client.gpu_settings([uuid]))[0]["owner"] is None
