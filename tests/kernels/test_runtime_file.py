"""The host agent's runtime file: written once it listens, gone after a clean exit, stale after
a kill (and then never read as a live agent)."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import pytest

from kernelfleet.runtime_file import RUNTIME_FILE, AgentRuntime, read_runtime

from .conftest import AgentProcess

pytestmark = pytest.mark.timeout(60)

StartAgent = Callable[..., Awaitable[AgentProcess]]


async def test_the_runtime_file_says_where_the_agent_listens_until_it_exits(
    host_agent: StartAgent,
) -> None:
    agent = await host_agent()
    pid = agent.process.pid
    runtime = read_runtime(agent.state_dir, AgentRuntime, pid)
    assert runtime is not None
    port = int(agent.address.rsplit(":", 1)[1])
    assert runtime == AgentRuntime(agent.host_id, f"http://127.0.0.1:{port}", port, pid)
    assert (await agent.client.host_info())["id"] == agent.host_id  # it answers there
    assert not list(agent.state_dir.glob(f".{RUNTIME_FILE}*")), "nothing left aside"

    agent.signal(signal.SIGTERM)
    assert await agent.wait_exit(15) == 0
    assert not (agent.state_dir / RUNTIME_FILE).exists()


async def test_a_killed_agent_leaves_a_stale_file_that_names_no_agent(
    host_agent: StartAgent,
) -> None:
    agent = await host_agent()
    agent.signal(signal.SIGKILL)
    await agent.wait_exit(10)
    assert (agent.state_dir / RUNTIME_FILE).exists()
    assert read_runtime(agent.state_dir, AgentRuntime) is None
    assert read_runtime(agent.state_dir, AgentRuntime, agent.process.pid) is None
