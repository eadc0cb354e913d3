"""Container kernels through the real gateway: a user's image with pandas, replicated over
three host agents whose kernels run as users of their own, in containers of podman's."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.kernels.agent.containers.engine import LABEL_KERNEL, Engine, list_containers
from kernelfleet.testing import Fleet, free_port, wait_until
from kernelfleet.testing.fleet import kernel_reachable_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def containers_of(engine: Engine, kernel_id: str) -> list[Any]:
    """The kernel's replica containers, running or not."""
    return list_containers(engine.client(), {"label": [f"{LABEL_KERNEL}={kernel_id}"]})


@pytest.fixture
def store() -> Iterator[Path]:
    """A folder every container mounts at the same path (the gateway's object store root)."""
    folder = kernel_reachable_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


async def wait_until_removed(engine: Engine, kernel_id: str, what: str) -> None:
    await wait_until(lambda: not containers_of(engine, kernel_id), 30, what)


async def test_a_notebook_imports_pandas_from_its_image_on_three_replicas(
    private_fleet: Callable[..., Fleet],
    engine_url: str,
    engine: Engine,
    container_kernelspecs: dict[str, str],
    store: Path,
) -> None:
    fleet = private_fleet(
        hosts=3,
        replicas=3,
        env=container_kernelspecs,
        gateway_args=(f"--GatewayApp.object_store_root={store}",),
        host_args=("--container-engine", engine_url, "--container-mount", str(store)),
    )
    specs = fleet.api("GET", "/api/kernelspecs")["kernelspecs"]
    assert specs["kf-c-pandas"]["spec"]["display_name"] == "Container kernel · pandas"
    # and per GPU count, as every replicated kernelspec
    one_gpu = specs["kf-c-pandas-1gpu"]["spec"]["display_name"]
    assert one_gpu == "Container kernel · pandas · 1 GPU"
    kernel_id = fleet.start_kernel("kf-c-pandas")
    ws = await fleet.connect(kernel_id)
    try:
        reply = await ws.execute(
            "import os, pandas\n"
            "frame = pandas.DataFrame({'x': range(100_000)})\n"  # over the Raft log's limit
            "print(pandas.__version__, os.getuid() == int(os.environ['USER'][7:]), "
            "frame.x.sum())",
            timeout=120,
        )
        assert reply.reply["status"] == "ok", reply.reply
        version, own_user, total = reply.stdout.split()
        assert version.startswith(("2.", "3."))
        assert own_user == "True"  # the kernel's own uid (USER is kernel-<uid>)
        assert total == str(sum(range(100_000)))
        reply = await ws.execute("print(len(frame))", timeout=60)
        assert reply.stdout == "100000\n"
    finally:
        ws.close()
    kernel = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    assert len([r for r in kernel["replicas"] if r["state"] == "ready"]) == 3
    ours = containers_of(engine, kernel_id)
    assert len(ours) == 3
    assert {c.attrs["Config"]["User"] for c in ours} == {ours[0].attrs["Config"]["User"]}
    assert ours[0].attrs["Config"]["User"] != ""

    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)

    await wait_until_removed(engine, kernel_id, "the kernel's containers to be removed")


async def test_a_kernel_keeps_its_state_across_a_restart_of_its_agent(
    private_fleet: Callable[..., Fleet],
    engine_url: str,
    engine: Engine,
    container_kernelspecs: dict[str, str],
    store: Path,
) -> None:
    """The agent is killed and started again before the gateway misses it (no link, a long
    heartbeat timeout): it adopts the kernel's container, and the kernel goes on."""
    fleet = private_fleet(
        hosts=1,
        replicas=1,
        env=container_kernelspecs,
        gateway_args=(
            f"--GatewayApp.object_store_root={store}",
            "--GatewayApp.heartbeat_timeout=120",
        ),
        host_args=(
            "--container-engine", engine_url, "--container-mount", str(store),
            "--HostAgentApp.link_to_gateway=False",
            "--port", str(free_port()),  # the same address again: the same agent, restarted
        ),
    )  # fmt: skip
    kernel_id = fleet.start_kernel("kf-c")
    ws = await fleet.connect(kernel_id)
    try:
        reply = await ws.execute("kept = 'before the restart'", timeout=60)
        assert reply.reply["status"] == "ok", reply.reply
    finally:
        ws.close()

    fleet.signal_host("host-1", signal.SIGKILL)  # its container is no process of its
    fleet.start_host("host-1", 2)  # (the gateway still lists the host alive)
    await wait_until(
        lambda: "adopted its running container" in fleet.log("host-1"), 30, "the adoption"
    )
    await wait_until(  # the new agent's first heartbeat, which lists the adopted replica
        lambda: "host host-1 restarted" in fleet.log("gateway"), 30, "the gateway to see it"
    )
    [replica] = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
    assert replica["state"] == "ready"

    ws = await fleet.connect(kernel_id)
    try:
        reply = await ws.execute("print(kept)", timeout=60)
        assert reply.stdout == "before the restart\n", reply.reply
    finally:
        ws.close()
    fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)

    await wait_until_removed(engine, kernel_id, "the kernel's container to be removed")


async def test_a_container_given_up_while_its_agent_was_away_is_stopped(
    private_fleet: Callable[..., Fleet],
    engine_url: str,
    engine: Engine,
    container_kernelspecs: dict[str, str],
    store: Path,
) -> None:
    """The gateway sees the agent's death at once (its link) and gives the kernel's only
    replica up; the restarted agent adopts the container, and the gateway stops it."""
    fleet = private_fleet(
        hosts=1,
        replicas=1,
        env=container_kernelspecs,
        gateway_args=(f"--GatewayApp.object_store_root={store}",),
        host_args=("--container-engine", engine_url, "--container-mount", str(store)),
    )
    kernel_id = fleet.start_kernel("kf-c")
    fleet.signal_host("host-1", signal.SIGKILL)

    def dead() -> bool:
        return fleet.api("GET", f"/api/kernels/{kernel_id}")["execution_state"] == "dead"

    await wait_until(dead, 30, "the kernel to be dead")
    fleet.start_host("host-1", 2)

    await wait_until_removed(engine, kernel_id, "the stray container to be stopped and removed")


async def test_container_kernels_go_only_to_hosts_that_reach_an_engine(
    private_fleet: Callable[..., Fleet],
    engine_url: str,
    engine: Engine,
    container_kernelspecs: dict[str, str],
    store: Path,
) -> None:
    """A mixed fleet: host-1 runs processes only, host-2 has a working engine, host-3's engine
    socket does not exist. Every container kernel lands on host-2; a process kernel anywhere."""
    fleet = private_fleet(
        hosts=1,
        replicas=1,
        env=container_kernelspecs,
        gateway_args=(f"--GatewayApp.object_store_root={store}",),
    )
    fleet.start_host("host-2", 2, "--container-engine", engine_url,
                     "--container-mount", str(store))  # fmt: skip
    fleet.start_host("host-3", 2, "--container-engine", f"unix://{store}/no-engine.sock")

    def containers() -> dict[str, Any]:
        return {h["id"]: h["containers"] for h in fleet.api("GET", "/api/fleet/hosts")}

    await wait_until(
        lambda: (containers()["host-3"] or {}).get("reachable") is False,
        30,
        "host-3 to report that its engine does not answer",
    )
    seen = containers()
    assert seen["host-1"] is None
    assert seen["host-2"] == {"engine": engine_url, "reachable": True, "why": None}
    assert "no-engine.sock" in seen["host-3"]["why"]

    kernel_ids = [fleet.start_kernel("kf-c") for _ in range(3)]
    for kernel_id in kernel_ids:
        replicas = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        assert [r["host"] for r in replicas] == ["host-2"], replicas
    assert len(list_containers(engine.client(), {"label": [f"{LABEL_KERNEL}"]})) >= 3
    plain = fleet.start_kernel("python3")
    ws = await fleet.connect(plain)
    try:
        assert (await ws.execute("print(6 * 7)")).stdout == "42\n"
    finally:
        ws.close()
    for kernel_id in kernel_ids:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    for kernel_id in kernel_ids:
        await wait_until_removed(engine, kernel_id, "the kernel's container to be removed")
