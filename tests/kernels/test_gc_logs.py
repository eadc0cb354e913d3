"""The gateway's log stays useful: host heartbeats (PUT /api/fleet/hosts/{id}, one per host
per second) and successful polls of the read-only lists are access-logged at DEBUG, every
other request as before."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from kernelfleet.web import log_request


def finished(method: str, uri: str, status: int) -> SimpleNamespace:
    path = uri.split("?", 1)[0]
    request = SimpleNamespace(
        method=method, uri=uri, path=path, remote_ip="127.0.0.1", request_time=lambda: 0.001
    )
    return SimpleNamespace(request=request, get_status=lambda: status)


@pytest.mark.parametrize(
    ("method", "uri", "status", "level"),
    [
        ("PUT", "/api/fleet/hosts/host-1", 200, logging.DEBUG),
        ("PUT", "/api/fleet/hosts/host-1?token=x", 200, logging.DEBUG),
        ("PUT", "/api/fleet/hosts/host-1", 401, logging.WARNING),  # a wrong token stays loud
        ("PUT", "/api/fleet/hosts/host-1", 500, logging.ERROR),
        ("GET", "/api/fleet/hosts/host-1", 200, logging.DEBUG),  # polled
        ("GET", "/api/kernels", 200, logging.DEBUG),
        ("GET", "/api/kernels/k-1", 200, logging.DEBUG),
        ("GET", "/api/kernels/k-1/channels", 101, logging.INFO),  # a websocket
        ("GET", "/api/fleet/kernels/k-1", 404, logging.WARNING),
        ("GET", "/api/fleet/events", 200, logging.INFO),
        ("DELETE", "/api/fleet/hosts/host-1", 204, logging.INFO),
        ("PUT", "/api/fleet/hosts/host-1/drain", 200, logging.INFO),
        ("POST", "/api/kernels", 201, logging.INFO),
    ],
)
def test_heartbeats_are_logged_at_debug_and_the_rest_as_before(
    caplog: pytest.LogCaptureFixture, method: str, uri: str, status: int, level: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="tornado.access")
    log_request(finished(method, uri, status))  # type: ignore[arg-type]
    (record,) = caplog.records
    assert record.levelno == level
    assert "token=x" not in record.getMessage()
