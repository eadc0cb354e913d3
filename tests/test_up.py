"""`kernelfleet up` as a user runs it: one command, a cell through jupyter_server, a clean stop."""

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from jupyter_server.gateway.gateway_client import GatewayClient

from kernelfleet.testing import (
    KernelWebsocket,
    call_json,
    descendants,
    free_port,
    pid_alive,
    wait_for,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

UP_LINE = re.compile(r"kernelfleet is up: (?P<url>http://\S+) token=(?P<token>\S+)")


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """`kernelfleet up` in a fresh folder, as the README says, with a free port."""
    cwd = tmp_path_factory.mktemp("up")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    process = subprocess.Popen(
        [
            *("kernelfleet", "up", "--port", str(free_port()), "--gpu-speed", "0.5,1.0"),
            *("--GatewayApp.policy=packing", "--HostAgentApp.gpu_type=passed-on"),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = process.stdout.readline()
    match = UP_LINE.search(line)
    if not match:
        process.kill()
        pytest.fail(f"kernelfleet up printed {line!r}{process.stdout.read()}")
    yield process, match["url"], match["token"], cwd
    if process.poll() is None:  # the test failed before stopping it: SIGTERM stops its children
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def jp_server_config(up):
    _, url, token, _ = up
    yield {
        "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
        "GatewayClient": {"url": url, "auth_token": token, "request_timeout": 60.0},
    }
    GatewayClient.clear_instance()


async def test_up_runs_a_cell_through_jupyter_server_then_stops_cleanly(up, jp_fetch, jp_ws_fetch):
    process, url, token, cwd = up
    assert len(token) >= 32, "a random token is generated when none is given"
    kernel = json.loads((await jp_fetch("api", "kernels", method="POST", body="{}")).body)
    ws = await jp_ws_fetch("api", "kernels", kernel["id"], "channels", params={"session_id": "up"})
    client = KernelWebsocket(ws)
    result = await client.execute("import numpy; print(numpy.arange(4).sum())")
    assert result.stdout == "6\n"
    client.close()
    await jp_fetch("api", "kernels", kernel["id"], method="DELETE")

    status, left_running = call_json(url + "/api/kernels", "POST", token, {"name": "python3"})
    assert status == 201, left_running
    status, view = call_json(url + f"/api/fleet/kernels/{left_running['id']}", token=token)
    assert status == 200, view
    replica = view["replicas"][0]
    status, hosts = call_json(url + "/api/fleet/hosts", token=token)
    speeds = [[d["relative_speed"] for d in host["gpus"]["devices"]] for host in hosts]
    assert speeds == [[0.5, 1.0]] * 3, "every agent got --gpu-speed"
    assert [host["gpus"]["type"] for host in hosts] == ["passed-on"] * 3, "and --HostAgentApp.*"
    status, fleet = call_json(url + "/api/fleet", token=token)
    assert fleet["policy"] == "packing", "the gateway got --GatewayApp.*"
    family = descendants(process.pid)
    assert replica["pid"] in family
    assert len(family) >= 5, f"expected a gateway, 3 hosts and a kernel, found {family}"
    assert (cwd / ".kernelfleet" / "logs" / "gateway.log").exists()

    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    wait_for(lambda: not any(pid_alive(pid) for pid in family), 10, "every child process to end")
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"stopping took {elapsed:.1f} s"


def test_up_fails_clearly_when_the_port_is_taken(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = subprocess.run(
            ["kernelfleet", "up", "--port", str(port), "--hosts", "1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert "gateway exited" in result.stderr
    assert "Address already in use" in result.stderr
    assert not subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True).stdout


def _up_once(cwd, *args: str) -> str:
    """Run ``kernelfleet up --hosts 1 ARGS`` in `cwd` until it says it is up, stop it (as
    Ctrl-C does), and return the token it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    process = subprocess.Popen(
        ["kernelfleet", "up", "--hosts", "1", "--port", str(free_port()), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()
        match = UP_LINE.search(line)
        assert match, f"kernelfleet up printed {line!r}{process.stdout.read()}"
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        return match["token"]
    finally:
        if process.poll() is None:
            process.kill()


def test_up_keeps_its_token_for_the_next_run_unless_told_otherwise(tmp_path):
    first = _up_once(tmp_path)
    token_file = tmp_path / ".kernelfleet" / "gateway" / "token"
    assert token_file.read_text().strip() == first
    assert token_file.stat().st_mode & 0o777 == 0o600, "the token is its owner's secret"
    assert _up_once(tmp_path) == first, "open JupyterLabs keep working after a restart"

    given = "a-token-given-on-the-command-line"
    assert _up_once(tmp_path, "--token", given) == given
    assert _up_once(tmp_path) == given, "the token given last is the one kept"

    token_file.write_text("short\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    refused = subprocess.run(
        ["kernelfleet", "up", "--hosts", "1", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert str(Path(".kernelfleet", "gateway", "token")) in refused.stderr
