"""The host agent's tool workers with real processes: an allowed module only, run on exactly
its devices with a scrubbed environment, stopped on request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.agent.kernel_process import Isolation
from kernelfleet.kernels.agent.tool_workers import WorkerRequest, WorkerTable
from kernelfleet.tools.pipeline.channel import TOKEN_ENV, Listener

SAME_USER = Isolation(False, "tests run workers as their own user")
MODULE = "kernelfleet.tools.pipeline.worker"


def body(**changes):
    return {"worker_id": "wrk-a", "kernel_id": "k1", "module": MODULE, "args": [],
            "devices": ["1"], "env": {TOKEN_ENV: "secret"}, **changes}  # fmt: skip


def test_only_allowed_modules_and_environment_variables_pass() -> None:
    assert WorkerRequest.from_json(body()).module == MODULE
    with pytest.raises(InvalidRequest, match="module 'os' may not be started"):
        WorkerRequest.from_json(body(module="os"))
    with pytest.raises(InvalidRequest, match="not LD_PRELOAD"):
        WorkerRequest.from_json(body(env={"LD_PRELOAD": "x.so"}))
    with pytest.raises(InvalidRequest, match="'worker_id' must match"):
        WorkerRequest.from_json(body(worker_id="job-a"))
    with pytest.raises(InvalidRequest, match="'args'"):
        WorkerRequest.from_json(body(args="--x"))


@pytest.mark.slow
async def test_a_worker_runs_the_module_on_its_devices_without_the_fleet_token(tmp_path):
    listener = Listener("secret")
    base = {"PATH": "/usr/bin:/bin", "KERNELFLEET_TOKEN": "fleet", "KERNELFLEET_GATEWAY_URL": "u",
            "PYTHONPATH": __import__("os").environ.get("PYTHONPATH", "")}  # fmt: skip
    table = WorkerTable(tmp_path, SAME_USER, base_env=base)
    args = [listener.host, str(listener.port), "3"]
    worker = await table.start(WorkerRequest.from_json(body(args=args, devices=["0", "2"])))
    try:
        environ = (await asyncio.to_thread(Path(f"/proc/{worker.pid}/environ").read_bytes)).split(
            b"\0"
        )
        env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
        assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
        assert env[TOKEN_ENV] == "secret"
        assert "KERNELFLEET_TOKEN" not in env
        assert "KERNELFLEET_GATEWAY_URL" not in env
        channel = await asyncio.to_thread(listener.accept, 30.0)  # it presented the token
        assert await asyncio.to_thread(channel.receive, 30.0) == ("hello", 3)
        channel.close()
        stopped = await table.stop("wrk-a", grace=10)
        assert stopped.exited
        assert table.models()[0]["state"] == "exited"
        assert (tmp_path / "workers" / "wrk-a").is_dir()
        table.forget("wrk-a")
        assert table.models() == []
    finally:
        listener.close()
        await table.stop_all(grace=1)


@pytest.mark.slow
async def test_an_agent_started_again_stops_the_workers_it_finds(tmp_path):
    listener = Listener("secret")
    first = WorkerTable(tmp_path, SAME_USER)
    try:
        args = [listener.host, str(listener.port), "0"]
        await first.start(WorkerRequest.from_json(body(args=args)))
        channel = await asyncio.to_thread(listener.accept, 30.0)  # running, waiting
        second = WorkerTable(tmp_path, SAME_USER)
        assert await second.end_leftovers(grace=5) == ["wrk-a"]
        await asyncio.wait_for(first.get("wrk-a").done.wait(), 10)  # reaped by its parent
        assert first.get("wrk-a").exit_code is not None
        assert second.models() == []
        assert not (tmp_path / "workers" / "wrk-a").exists()
        channel.close()
    finally:
        listener.close()
        await first.stop_all(grace=1)
