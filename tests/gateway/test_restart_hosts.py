"""A restarted gateway still knows the hosts its autoscaler started, and may stop them
(issue 12, item 2): the local host provider keeps them in ``<state_dir>/hosts.json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from kernelfleet.gateway.host_provider import LocalProcessHostProvider
from kernelfleet.gateway.store import StateUnreadable
from kernelfleet.runtime_file import pid_alive
from kernelfleet.testing import TOKEN, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

NO_GATEWAY = "http://127.0.0.1:9"
"""Nothing listens there: the agents run without registering, which is all this needs."""


async def test_a_new_provider_adopts_the_running_hosts_of_the_previous_one_and_stops_them(
    tmp_path,
):
    first = LocalProcessHostProvider(NO_GATEWAY, TOKEN, tmp_path, gpus_per_host=1)
    host_id = await first.start_host()
    pid = first.process(host_id).pid
    try:
        stored = json.loads(first.hosts_file.read_text())
        assert stored["hosts"] == [{"id": host_id, "pid": pid}]

        # the gateway dies without stopping its hosts: a new one takes them back
        second = LocalProcessHostProvider(NO_GATEWAY, TOKEN, tmp_path, gpus_per_host=1)
        assert second.adopt() == (host_id,)
        assert second.hosts() == (host_id,)
        assert second._next_id() == "auto-2", "a new host does not reuse an adopted id"

        await second.stop_host(host_id)
        wait_for(lambda: not pid_alive(pid), 10, "the adopted agent to stop")
        assert second.hosts() == ()
        assert json.loads(second.hosts_file.read_text())["hosts"] == []
    finally:
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
        first.process(host_id).wait(10)


async def test_hosts_gone_meanwhile_are_forgotten(tmp_path):
    first = LocalProcessHostProvider(NO_GATEWAY, TOKEN, tmp_path, gpus_per_host=1)
    host_id = await first.start_host()
    process = first.process(host_id)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)
    second = LocalProcessHostProvider(NO_GATEWAY, TOKEN, tmp_path, gpus_per_host=1)
    assert second.adopt() == ()
    assert second.hosts() == ()
    assert json.loads(second.hosts_file.read_text())["hosts"] == []


@pytest.mark.parametrize(
    "content",
    ['{"version": 1, "hosts": [{"id": "auto-1", "pi', '{"version": 1, "hosts": [{"id": 3}]}'],
    ids=["truncated", "bad-entry"],
)
def test_an_unreadable_hosts_file_is_refused_naming_it(tmp_path, content):
    (tmp_path / "hosts.json").write_text(content)
    with pytest.raises(StateUnreadable, match=r"hosts\.json"):
        LocalProcessHostProvider(NO_GATEWAY, TOKEN, tmp_path).adopt()


def test_an_autoscaling_gateway_with_an_unreadable_hosts_file_exits_2_naming_it(tmp_path):
    state_dir = tmp_path / "gateway"
    hosts_file = state_dir / "autoscaled" / "hosts.json"
    hosts_file.parent.mkdir(parents=True)
    hosts_file.write_text('{"version": 1, "hosts": [')
    result = subprocess.run(
        [sys.executable, "-m", "kernelfleet", "gateway", "--port", "0", "--autoscale",
         "--state-dir", str(state_dir), "--token", TOKEN],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert str(hosts_file) in result.stderr
