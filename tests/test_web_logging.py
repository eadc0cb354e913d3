"""No token reaches a log: the access logs (and uncaught-error logs) of the gateway and the host
agents show a ``?token=`` argument's value as ``[secret]`` (`kernelfleet.web.log_request`)."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from kernelfleet.gateway.kernel_tokens import KernelTokens
from kernelfleet.runtime_file import AgentRuntime, read_runtime
from kernelfleet.testing import Fleet, wait_for
from kernelfleet.web import REDACTED, ApiHandler, log_request, redact_uri

SECRET = "s3cret-0123456789abcdef"


@pytest.mark.parametrize(
    ("uri", "logged"),
    [
        ("/api/fleet", "/api/fleet"),
        (f"/api/fleet?token={SECRET}", f"/api/fleet?token={REDACTED}"),
        (f"/a?n=5&token={SECRET}&kernel=k1", f"/a?n=5&token={REDACTED}&kernel=k1"),
        (f"/a?%74oken={SECRET}", f"/a?%74oken={REDACTED}"),  # the name percent-encoded
        (f"/a?token={SECRET}&token={SECRET}", f"/a?token={REDACTED}&token={REDACTED}"),
        (f"/a?token_hint={SECRET}", f"/a?token_hint={SECRET}"),  # not a token argument
        ("/a?token", "/a?token"),
    ],
)
def test_redact_uri_hides_every_token_argument(uri: str, logged: str) -> None:
    assert redact_uri(uri) == logged


class Failing(ApiHandler):
    def get(self) -> None:
        raise RuntimeError("boom")


async def test_an_application_logs_requests_and_errors_without_their_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Application(
        [("/ok", ApiHandler), ("/fail", Failing)], token=SECRET, log_function=log_request
    )
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    client = AsyncHTTPClient()
    caplog.set_level(logging.INFO)
    try:
        for path, status in [("/ok", 405), ("/fail", 500), ("/nothing", 404)]:
            with pytest.raises(HTTPClientError) as error:
                await client.fetch(f"{url}{path}?token={SECRET}&x=1")
            assert error.value.code == status
    finally:
        server.stop()
    text = caplog.text
    assert SECRET not in text
    assert f"405 GET /ok?token={REDACTED}&x=1 (127.0.0.1)" in text
    assert f"500 GET /fail?token={REDACTED}&x=1 (127.0.0.1)" in text
    assert f"Uncaught exception GET /fail?token={REDACTED}&x=1 (127.0.0.1)" in text
    assert "RuntimeError: boom" in text


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.timeout(120)
def test_the_gateway_and_agents_log_no_token(fleet: Fleet) -> None:
    kernel_id = fleet.start_kernel()
    kernel_token = KernelTokens(fleet.token).issue(kernel_id)
    runtime = read_runtime(fleet.state_dir / "host-1", AgentRuntime)
    assert runtime is not None
    calls = [
        (f"{fleet.url}/api/fleet?token={fleet.token}", 200),
        (f"{fleet.url}/api/nothing?token={fleet.token}", 404),
        (f"{fleet.url}/api/fleet/kernels/{kernel_id}?token={kernel_token}", 200),
        (f"{fleet.url}/api/fleet/kernels?token={kernel_token}", 403),
        (f"{runtime.address}/api/host?token={fleet.token}", 200),
        (f"{runtime.address}/api/nothing?token={fleet.token}", 404),
    ]
    try:
        for url, status in calls:
            assert get_status(url) == status, url
    finally:
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    for label in ("gateway", "host-1"):  # the 404 is logged by both (the agent: WARNING up)
        wait_for(lambda label=label: "GET /api/nothing?" in fleet.log(label), 10, "a log line")
        log = fleet.log(label)
        assert fleet.token not in log, label
        assert kernel_token.rsplit(".", 1)[1] not in log, label
        assert f"404 GET /api/nothing?token={REDACTED} (127.0.0.1)" in log, label
    gateway_log = fleet.log("gateway")
    assert f"403 GET /api/fleet/kernels?token={REDACTED}" in gateway_log
