"""The panel API when there is no fleet to show: the gateway unreachable (502 naming its URL,
recovering by itself when it answers again) and a server not in gateway mode (409)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.testing import free_port
from kernelfleet.testing.fleet import TOKEN, Fleet

pytestmark = pytest.mark.timeout(120)
KERNEL = "00000000-0000-0000-0000-000000000000"


async def error_of(call) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as error:
        await call
    assert error.value.response is not None
    return error.value.code, json.loads(error.value.response.body)


class TestGatewayUnreachable:
    @pytest.fixture
    def gateway_port(self) -> int:
        return free_port()

    @pytest.fixture
    def jp_server_config(self, gateway_port: int) -> dict:
        return {
            "ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}},
            "GatewayClient": {
                "url": f"http://127.0.0.1:{gateway_port}",
                "auth_token": TOKEN,
                "request_timeout": 20.0,
            },
        }

    async def test_502_names_the_url_then_recovers_when_the_gateway_answers(
        self, jp_fetch, jp_ws_fetch, gateway_port: int, tmp_path: Path
    ) -> None:
        url = f"http://127.0.0.1:{gateway_port}"
        for path in ("fleet", "sections"):
            status, error = await error_of(jp_fetch("kernelfleet", "api", path))
            assert status == 502, path
            assert error["reason"] == "gateway-unreachable"
            assert url in error["message"]
        status, error = await error_of(jp_ws_fetch("kernelfleet", "api", "events"))
        assert (status, error["reason"]) == (502, "gateway-unreachable")
        assert url in error["message"]

        fleet = Fleet(state_dir=tmp_path / "fleet", token=TOKEN, env={})
        try:
            fleet.start_gateway("--replicas", "1", port=gateway_port)
            body = json.loads((await jp_fetch("kernelfleet", "api", "fleet")).body)
            assert body["fleet"]["kernels"] == 0
            assert body["hosts"] == []
        finally:
            fleet.stop()


class TestNotGatewayMode:
    @pytest.fixture
    def jp_server_config(self) -> dict:
        return {"ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}}}

    async def test_409_not_kernelfleet(self, jp_fetch, jp_ws_fetch) -> None:
        kernel = json.loads(
            (await jp_fetch("api", "kernels", method="POST", body='{"name": "python3"}')).body
        )
        try:
            calls = {
                "fleet": jp_fetch("kernelfleet", "api", "fleet"),
                "kernel": jp_fetch("kernelfleet", "api", "kernels", kernel["id"]),
                "unknown kernel": jp_fetch("kernelfleet", "api", "kernels", KERNEL),
                "sections": jp_fetch("kernelfleet", "api", "sections"),
                "events": jp_ws_fetch("kernelfleet", "api", "events"),
            }
            for name, call in calls.items():
                status, error = await error_of(call)
                assert (status, error["reason"]) == (409, "not-kernelfleet"), name
                assert "gateway" in error["message"]
        finally:
            await jp_fetch("api", "kernels", kernel["id"], method="DELETE")
