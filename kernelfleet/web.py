"""HTTP plumbing shared by the gateway and the host agents.

``ApiHandler`` checks the token on every request (header ``Authorization: token <t>`` or the
``?token=`` query argument) and turns every error, domain or not, into a JSON body
``{"reason", "message"}``. Domain errors are mapped to status codes here and nowhere else.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from typing import Any

from tornado import web

from kernelfleet.errors import (
    Conflict,
    FleetError,
    GpusUnavailable,
    HostUnavailable,
    InvalidRequest,
    KernelDead,
    KernelStartFailed,
    LedgerInconsistent,
    NoCapacity,
    NotFound,
)

log = logging.getLogger("kernelfleet.web")

STATUS_FOR_ERROR: dict[type[FleetError], int] = {
    NotFound: 404,
    InvalidRequest: 400,
    Conflict: 409,
    NoCapacity: 503,
    KernelStartFailed: 500,
    HostUnavailable: 502,
    KernelDead: 409,
    GpusUnavailable: 503,
    LedgerInconsistent: 500,
}

REASON_FOR_STATUS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
}


def new_token() -> str:
    """A fresh random token, safe to print and paste."""
    return secrets.token_hex(24)


def status_for(error: FleetError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS_FOR_ERROR:
            return STATUS_FOR_ERROR[cls]
    return 500


def token_from_request(request: Any) -> str | None:
    """The token a request presents, from its Authorization header or its ``token`` argument."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    token = request.query_arguments.get("token")
    return token[0].decode("utf-8", "replace") if token else None


def token_matches(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


class TokenAuthMixin:
    """Refuses any request that does not present the application's token (settings ``token``)."""

    request: Any
    settings: dict[str, Any]

    def check_token(self) -> None:
        presented = token_from_request(self.request)
        if presented is None:
            raise web.HTTPError(401, "a token is required: send 'Authorization: token <token>'")
        if not token_matches(presented, self.settings["token"]):
            raise web.HTTPError(403, "the token is not valid")


class JsonErrorsMixin:
    """Writes every error as ``{"reason", "message"}``; domain errors get their mapped status."""

    request: Any
    _reason: str

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, FleetError):
            status_code = status_for(exc)
        super().send_error(status_code, **kwargs)  # type: ignore[misc]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, FleetError):
            reason, message = exc.reason, exc.message
        elif isinstance(exc, web.HTTPError):
            reason = REASON_FOR_STATUS.get(status_code, exc.reason or "http-error")
            message = exc.log_message or self._reason
        else:
            reason, message = "internal-error", "an unexpected error happened; see the server log"
        self.set_header("Content-Type", "application/json; charset=UTF-8")  # type: ignore[attr-defined]
        self.finish(json.dumps({"reason": reason, "message": message}))  # type: ignore[attr-defined]

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, FleetError | web.HTTPError):
            log.info("%s %s -> %s", self.request.method, self.request.path, value)
        else:
            super().log_exception(typ, value, tb)  # type: ignore[misc]


class ApiHandler(TokenAuthMixin, JsonErrorsMixin, web.RequestHandler):
    """Base for JSON endpoints: token checked in ``prepare``, errors written as JSON."""

    def prepare(self) -> None:
        self.check_token()

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object; an empty body reads as ``{}``."""
        if not self.request.body:
            return {}
        try:
            body = json.loads(self.request.body)
        except ValueError as e:
            raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        return body

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))


class NotFoundHandler(ApiHandler):
    """Catch-all: an unknown path still answers JSON (after the token check)."""

    def prepare(self) -> None:
        super().prepare()
        raise web.HTTPError(404, f"no such endpoint: {self.request.path}")
