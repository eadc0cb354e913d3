"""HTTP plumbing shared by the gateway and the host agents.

``ApiHandler`` checks the token on every request (header ``Authorization: token <t>`` or the
``?token=`` query argument) and turns every error, domain or not, into a JSON body
``{"reason", "message"}``. Domain errors are mapped to status codes here and nowhere else.

Besides the application's token (the fleet token), a server may accept kernel-scoped tokens
(`KERNEL_TOKEN_PREFIX`): its settings then carry ``kernel_token_check``, a `KernelTokenCheck`.
Each handler says what such a token may do with its ``kernel_access`` (nothing, by default).

Tokens never reach a log: both applications set `log_request` as their ``log_function`` (the
access log), and uncaught errors are logged with the same `redact_uri`.
"""

from __future__ import annotations

import enum
import hmac
import json
import logging
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from tornado import web
from tornado.log import access_log, app_log

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
    NotServing,
    PermissionDenied,
)
from kernelfleet.protocol import KERNEL_TOKEN_PREFIX

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
    PermissionDenied: 403,
    NotServing: 503,
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


def is_kernel_token(token: str | None) -> bool:
    """Whether `token` has the form of a kernel-scoped token (valid or not)."""
    return token is not None and token.startswith(f"{KERNEL_TOKEN_PREFIX}.")


def token_from_request(request: Any) -> str | None:
    """The token a request presents, from its Authorization header or its ``token`` argument."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    token = request.query_arguments.get("token")
    return token[0].decode("utf-8", "replace") if token else None


REDACTED = "[secret]"
"""What a log shows in place of a ``token`` query argument's value."""


def redact_uri(uri: str) -> str:
    """`uri` (a request's path and query) with the value of every ``token`` query argument
    replaced by `REDACTED`; the rest of the query is kept as sent."""
    path, question, query = uri.partition("?")
    if not question:
        return uri
    arguments = []
    for argument in query.split("&"):
        name, equals, _value = argument.partition("=")
        if equals and urllib.parse.unquote_plus(name) == "token":
            argument = f"{name}={REDACTED}"
        arguments.append(argument)
    return f"{path}?{'&'.join(arguments)}"


def request_summary(request: Any) -> str:
    """``METHOD URI (REMOTE_IP)`` as tornado logs a request, its token redacted."""
    return f"{request.method} {redact_uri(request.uri or '')} ({request.remote_ip})"


QUIET_REQUESTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PUT", re.compile(r"/api/fleet/hosts/[^/?]+")),  # host agents' heartbeats, 1 per second each
    # what JupyterLab (through jupyter_server), the panel and scripts poll, read-only:
    ("GET", re.compile(r"/api/(kernels|kernelspecs|fleet|fleet/hosts|fleet/kernels)")),
    ("GET", re.compile(r"/api/(kernels|fleet/kernels|fleet/hosts)/[^/?]+")),
)
"""(method, path) of the routine requests whose success is logged at DEBUG, not INFO: on a
3-host fleet the heartbeats alone were 89 % of the gateway's log. Changes (POST, DELETE, ...),
websockets and every failure are logged as before."""


def is_quiet(request: Any) -> bool:
    """Whether `request` is one of `QUIET_REQUESTS`."""
    path = (request.path or "").rstrip("/")
    return any(request.method == m and pattern.fullmatch(path) for m, pattern in QUIET_REQUESTS)


def log_request(handler: web.RequestHandler) -> None:
    """The access log line of a finished request (the applications' ``log_function``): as
    tornado's own (INFO below 400, WARNING below 500, ERROR above), with no token in it; a
    successful routine request (`QUIET_REQUESTS`: heartbeats) at DEBUG."""
    status = handler.get_status()
    if status < 400 and is_quiet(handler.request):
        log_method = access_log.debug
    elif status < 400:
        log_method = access_log.info
    elif status < 500:
        log_method = access_log.warning
    else:
        log_method = access_log.error
    request_time = 1000.0 * handler.request.request_time()
    log_method("%d %s %.2fms", status, request_summary(handler.request), request_time)


def token_matches(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


class KernelAccess(enum.Enum):
    """What a kernel-scoped token may do with one method of a handler (``kernel_access``)."""

    ANY = "any"
    """Any live kernel's token may call it; the handler narrows what it shows to
    ``kernel_principal`` where it must (the events of that kernel only, say)."""
    OWN = "own"
    """Only the token of the kernel the path names (its ``kernel_id`` argument)."""


class KernelTokenCheck(Protocol):
    """Settings ``kernel_token_check``: the id of the live kernel a kernel-scoped token was
    issued for, or None when it is forged or its kernel is gone (the check logs a warning
    saying which)."""

    def __call__(self, token: str) -> str | None: ...


class TokenAuthMixin:
    """Refuses any request that does not present the application's token (settings ``token``)
    or, where the settings have a ``kernel_token_check``, a kernel-scoped token allowed here.

    No token: 401. A kernel token that is forged or whose kernel is gone: 401. A valid kernel
    token on a method its handler's ``kernel_access`` does not grant, or on another kernel
    than its own where the grant is `KernelAccess.OWN`: 403. Any other wrong token: 403.
    After the check, ``kernel_principal`` is the kernel whose token was presented, or None
    for the fleet token."""

    request: Any
    settings: dict[str, Any]
    path_kwargs: dict[str, Any]
    kernel_access: ClassVar[Mapping[str, KernelAccess]] = {}
    """HTTP method -> what kernel tokens may do with it; a method not named: nothing."""
    kernel_principal: str | None = None

    def check_token(self) -> None:
        presented = token_from_request(self.request)
        if presented is None:
            raise web.HTTPError(401, "a token is required: send 'Authorization: token <token>'")
        if token_matches(presented, self.settings["token"]):
            self.kernel_principal = None
            return
        check: KernelTokenCheck | None = self.settings.get("kernel_token_check")
        if check is None or not is_kernel_token(presented):
            raise web.HTTPError(403, "the token is not valid")
        kernel_id = check(presented)
        if kernel_id is None:
            raise web.HTTPError(401, "the kernel token is not valid: forged, or its kernel is gone")
        self.kernel_principal = kernel_id
        self._check_kernel_access(kernel_id)

    def _check_kernel_access(self, kernel_id: str) -> None:
        method, path = self.request.method, self.request.path
        access = self.kernel_access.get(method)
        if access is KernelAccess.ANY:
            return
        if access is KernelAccess.OWN:
            if self.path_kwargs.get("kernel_id") == kernel_id:
                return
            raise web.HTTPError(403, f"kernel {kernel_id}'s token reaches only its own kernel")
        raise web.HTTPError(403, f"a kernel's token may not {method} {path}")


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
        else:  # as tornado logs it, less the token its request URI may carry
            summary = request_summary(self.request)
            app_log.error("Uncaught exception %s", summary, exc_info=(typ, value, tb))


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
