"""The container replica runtime through a real host agent, real kernels and podman's
Docker-compatible API (the session's own service; images built once per session)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.errors import Conflict, KernelStartFailed
from kernelfleet.kernels.agent.containers import images
from kernelfleet.kernels.agent.containers.engine import (
    LABEL_HOST,
    LABEL_REPLICA,
    Engine,
    list_containers,
)
from kernelfleet.testing import wait_until
from tests.containers.conftest import podman_service
from tests.kernels.conftest import REPO_ROOT, AgentProcess
from tests.kernels.test_agent import connect, execute

StartAgent = Callable[..., Awaitable[AgentProcess]]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def container_agent(
    host_agent: StartAgent, engine_url: str, specs: dict[str, str], **kwargs: Any
) -> AgentProcess:
    return await host_agent(
        args=["--container-engine", engine_url, *kwargs.pop("args", [])], env=specs, **kwargs
    )


def containers_of(engine: Engine, host_id: str) -> list[Any]:
    return list_containers(engine.client(), {"label": [f"{LABEL_HOST}={host_id}"]})


async def test_start_execute_interrupt_restart_stop(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    model = await agent.client.start_replica("c1", "k1", "kf-c", env={"FLEET_TEST_VAR": "hi"})
    assert model["state"] == "ready"
    assert model["runtime"] == "container"
    [container] = containers_of(engine, agent.host_id)
    assert container.labels[LABEL_REPLICA] == "c1"
    host_config = container.attrs["HostConfig"]
    assert host_config["NetworkMode"] == "host"
    assert host_config["Memory"] == 512 * 2**20
    assert host_config["NanoCpus"] == 10**9

    kc = await connect(model["connection"])
    try:
        reply, out = await execute(
            kc,
            "import os, sys; print(sys.executable, os.environ['FLEET_TEST_VAR'], "
            "os.environ['KERNELFLEET_REPLICA_ID'], 'PYTHONPATH' in os.environ, "
            "'KERNELFLEET_TOKEN' in os.environ, "
            "os.path.exists('/.containerenv') or os.path.exists('/run/.containerenv'))",
        )
        assert reply["status"] == "ok", reply
        # the image's Python, the request's env, the agent's host-only variables left out
        assert out.split() == ["/usr/bin/python3", "hi", "c1", "False", "False", "True"]

        started = asyncio.Event()

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and "sleeping" in msg["content"]["text"]:
                started.set()

        code = "import time; print('sleeping', flush=True); time.sleep(60)"
        cell = asyncio.ensure_future(kc.execute_interactive(code, timeout=60, output_hook=hook))
        await asyncio.wait_for(started.wait(), 20)
        await agent.client.interrupt_replica("c1")
        interrupted = await asyncio.wait_for(cell, 20)
        assert interrupted["content"]["ename"] == "KeyboardInterrupt"
        reply, _ = await execute(kc, "x = 1")
        assert reply["status"] == "ok"
    finally:
        kc.stop_channels()

    restarted = await agent.client.restart_replica("c1")
    assert restarted["connection"] == model["connection"]
    [again] = containers_of(engine, agent.host_id)
    assert again.id != container.id  # a new container, same ports
    kc = await connect(restarted["connection"])
    try:
        reply, _ = await execute(kc, "x")
        assert reply["ename"] == "NameError"
    finally:
        kc.stop_channels()

    await agent.client.stop_replica("c1")
    assert containers_of(engine, agent.host_id) == []
    assert not (agent.state_dir / "replicas" / "c1").exists()


async def test_a_killed_container_is_reported_dead(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    await agent.client.start_replica("c2", "k2", "kf-c")
    [container] = containers_of(engine, agent.host_id)
    container.kill(signal="SIGKILL")

    async def dead() -> dict[str, Any] | None:
        model = await agent.client.get_replica("c2")
        return model if model["state"] == "dead" else None

    model = await wait_until(dead, 20, "the replica to be reported dead")
    assert model["exit_code"] == 137
    await agent.client.stop_replica("c2")
    assert containers_of(engine, agent.host_id) == []


async def test_the_memory_limit_is_named_when_it_kills_the_kernel(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    model = await agent.client.start_replica("c3", "k3", "kf-c")
    kc = await connect(model["connection"])
    try:
        cell = asyncio.ensure_future(
            kc.execute_interactive("hog = bytearray(2 * 2**30)", timeout=60)
        )

        async def dead() -> dict[str, Any] | None:
            found = await agent.client.get_replica("c3")
            return found if found["state"] == "dead" else None

        dead_model = await wait_until(dead, 30, "the replica to be killed by its memory limit")
        cell.cancel()
    finally:
        kc.stop_channels()
    assert dead_model["exit_code"] == 137
    # podman 4.3.1 does not report OOMKilled; an engine that does is named outright
    assert "its memory limit (512 MiB in the kernelspec)" in dead_model["exit_reason"]
    await agent.client.stop_replica("c3")


async def test_containers_are_adopted_by_a_restarted_agent(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    model = await agent.client.start_replica("c4", "k4", "kf-c", raft=True)
    kc = await connect(model["connection"])
    try:
        reply, _ = await execute(kc, "kept = 'still here'")
        assert reply["status"] == "ok"
    finally:
        kc.stop_channels()

    agent.signal(signal.SIGKILL)  # the container outlives it
    await agent.wait_exit(10)
    [container] = containers_of(engine, agent.host_id)
    assert container.status == "running"

    again = await container_agent(
        host_agent, engine_url, container_kernelspecs, state_dir=agent.state_dir
    )
    [adopted] = await again.client.list_replicas()
    assert adopted["id"] == "c4"
    assert adopted["state"] == "ready"
    assert adopted["connection"] == model["connection"]
    assert adopted["raft_address"] == model["raft_address"]
    kc = await connect(adopted["connection"])
    try:
        _, out = await execute(kc, "print(kept)")
        assert out == "still here\n"
    finally:
        kc.stop_channels()

    await again.client.stop_replica("c4")  # the new agent owns it
    assert containers_of(engine, agent.host_id) == []


async def test_a_kernel_that_exits_at_once_shows_its_output(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    with pytest.raises(KernelStartFailed) as failed:
        await agent.client.start_replica("c5", "k5", "kf-c-nokernel", launch_timeout=60)
    message = failed.value.message
    assert "exited with code 1 before it was ready" in message
    assert "No module named 'kernelfleet'" in message  # the container's own output
    assert containers_of(engine, agent.host_id) == []
    log = (agent.state_dir / "replicas" / "c5" / "kernel.log").read_text()
    assert "No module named 'kernelfleet'" in log  # kept for the operator


async def test_a_missing_image_or_python_is_named(
    host_agent: StartAgent, engine_url: str, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    agent = await container_agent(host_agent, engine_url, container_kernelspecs)
    with pytest.raises(KernelStartFailed) as failed:
        await agent.client.start_replica("c6", "k6", "kf-c-missing")
    assert "image 'localhost/kernelfleet-test-no-such-image:1' is not on this host's" in (
        failed.value.message
    )
    with pytest.raises(KernelStartFailed) as failed:
        await agent.client.start_replica("c7", "k7", "kf-c-nopython")
    assert "(image 'localhost/kernelfleet-test-no-python:1' cannot run 'python3'" in (
        failed.value.message
    )
    assert containers_of(engine, agent.host_id) == []
    assert await agent.client.list_replicas() == []


async def test_an_agent_without_an_engine_refuses_container_kernelspecs(
    host_agent: StartAgent, container_kernelspecs: dict[str, str]
) -> None:
    agent = await host_agent(env=container_kernelspecs)
    with pytest.raises(Conflict, match="runs kernels in containers"):
        await agent.client.start_replica("c8", "k8", "kf-c")


def run_cli(engine_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": engine_url, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "kernelfleet", "image", "build", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_image_build_names_a_bad_base_and_writes_the_kernelspec(
    engine_url: str, engine: Engine, base_image: str, kernel_image: str, tmp_path: Path
) -> None:
    missing = run_cli(engine_url, "--base", "localhost/no-such-base:1", "--tag", "localhost/x:1")
    assert missing.returncode == 1
    assert "base image 'localhost/no-such-base:1' is not on the container engine" in (
        missing.stderr
    )
    no_python = run_cli(
        engine_url, "--base", "localhost/kernelfleet-test-no-python:1", "--tag", "localhost/x:1"
    )
    assert no_python.returncode == 1
    assert "base image 'localhost/kernelfleet-test-no-python:1' cannot run python3" in (
        no_python.stderr
    )
    # the session's kernel image again: unchanged, so nothing is built; the kernelspec is new
    built = run_cli(
        engine_url, "--base", base_image, "--tag", kernel_image, "--kernelspec", "kf-made",
        "--display-name", "Python 3.11 · container", "--memory", "1g",
        "--kernelspec-dir", str(tmp_path),
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "(unchanged)" in built.stdout
    spec = json.loads((tmp_path / "kf-made" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3.11 · container"
    assert spec["metadata"]["kernelfleet"] == {
        "runtime": "container", "image": kernel_image, "memory": "1g",
    }  # fmt: skip
    leftovers = list_containers(engine.client(), {"ancestor": base_image})
    assert leftovers == []  # the Python probe's container is gone


async def test_an_engine_that_goes_away_gives_its_replicas_up(
    host_agent: StartAgent, engine: Engine, container_kernelspecs: dict[str, str]
) -> None:
    with podman_service() as doomed:  # a second service on the same storage, stopped below
        agent = await container_agent(host_agent, doomed, container_kernelspecs)
        await agent.client.start_replica("c9", "k9", "kf-c")
        assert (await agent.client.host_info())["containers"]["reachable"] is True
    # its socket is gone now; the container itself runs on (podman's conmon keeps it)
    [container] = containers_of(engine, agent.host_id)
    assert container.status == "running"

    async def given_up() -> dict[str, Any] | None:
        model = await agent.client.get_replica("c9")
        return model if model["state"] == "dead" else None

    model = await wait_until(given_up, 20, "the replica to be given up")
    assert "cannot be reached" in model["exit_reason"]
    assert "the agent can no longer watch its container" in model["exit_reason"]
    host = await agent.client.host_info()
    assert host["containers"]["reachable"] is False
    assert doomed.removeprefix("unix://") in host["containers"]["why"]

    await agent.client.stop_replica("c9")  # asks the kernel itself to exit

    def exited() -> bool:
        container.reload()
        return container.status == "exited"

    await wait_until(exited, 20, "the kernel and its container to exit")
    container.remove(force=True)


def test_a_listing_leaves_out_containers_removed_while_it_runs(engine: Engine, kernel_image: str):
    """podman answers 500 "no such container" (not 404) when a listed container is removed
    before its inspection; ``containers.list`` raises on it, `list_containers` must not."""
    client = engine.client()
    label = {"io.kernelfleet.test": "listing-race"}
    sleeper = ["python3", "-c", "import time; time.sleep(60)"]
    for _ in range(4):
        ids = [
            client.api.create_container(kernel_image, command=sleeper, labels=label)["Id"]
            for _ in range(3)
        ]
        for container_id in ids:
            client.api.start(container_id)
        remover = threading.Thread(
            target=lambda ids=ids: [client.api.remove_container(i, force=True) for i in ids]
        )
        remover.start()
        while remover.is_alive():
            listed = list_containers(client, {"label": ["io.kernelfleet.test=listing-race"]})
            assert {c.id for c in listed} <= set(ids)
        remover.join()
    assert list_containers(client, {"label": ["io.kernelfleet.test=listing-race"]}) == []


def test_a_rebuilt_recipe_installs_its_own_wheels_not_a_cached_layer(
    engine: Engine, base_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds whose kernelfleet wheels differ by one file: the second image holds the
    second wheel's file (an engine's layer cache keys the install step by its text alone)."""
    write_wheel = images.write_kernelfleet_wheel
    tag = "localhost/kernelfleet-test-rebuilt:1"

    def build_with(marker: str) -> str:
        def marked_wheel(folder: Path) -> Path:
            wheel = write_wheel(folder)
            with zipfile.ZipFile(wheel, "a") as archive:
                archive.writestr("kernelfleet/build_marker.txt", marker)
            return wheel

        monkeypatch.setattr(images, "write_kernelfleet_wheel", marked_wheel)
        built = images.build_kernel_image(engine, base_image, tag, log=lambda _line: None)
        assert not built.reused
        read = (
            "import kernelfleet, pathlib; "
            "print(pathlib.Path(kernelfleet.__file__).with_name('build_marker.txt').read_text())"
        )
        output = engine.client().containers.run(tag, ["python3", "-c", read], remove=True)
        return bytes(output).decode().strip()

    try:
        assert build_with("first") == "first"
        assert build_with("second") == "second"
    finally:
        engine.client().images.remove(tag, force=True)
