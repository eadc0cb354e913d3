"""``FleetClient``: a notebook's client of the kernelfleet gateway's admin API.

It runs inside a kernel (the ``%fleet`` and ``%gpus`` magics are a thin shell over it) or in any
Python process; it needs neither IPython nor anything beyond the standard library. Inside a
kernelfleet kernel, ``FleetClient.from_environment()`` finds the gateway and the kernel's own
token in the replica's environment. That token is scoped to the kernel: it reads the kernel and
the fleet summary, and acts on this kernel only (migrate it, set its GPU count, set the clocks
and power limits of the GPUs its running cell holds).

Every call is one blocking HTTP request with a timeout. Errors:

- `GatewayUnreachable`: no answer at all (refused, timed out, DNS); the message names the URL;
- `FleetApiError`: the gateway answered an error; ``status``, ``reason`` and ``message`` are
  the gateway's (its JSON ``{"reason", "message"}``);
- `NotAFleetKernel`: ``from_environment()`` outside a kernel that kernelfleet runs.

All three are `kernelfleet.errors.FleetError` subclasses, and IPython shows each as one line
(their ``_render_traceback_``), not as a traceback through this module.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from kernelfleet.errors import FleetError
from kernelfleet.protocol import ReplicaEnv

# The gateway's URL and the kernel's own token, as the host agent sets them in a replica's
# environment.
GATEWAY_URL_VARIABLE = ReplicaEnv.GATEWAY_URL.value
KERNEL_TOKEN_VARIABLE = ReplicaEnv.KERNEL_TOKEN.value

DEFAULT_TIMEOUT = 10.0


class ClientError(FleetError):
    """Base of the client's errors; shown by IPython as one line, ``Name: message``."""

    reason = "client-error"

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self.message}"]


class NotAFleetKernel(ClientError):
    """The code does not run in a kernel that kernelfleet started (or its host agent predates
    the kernel tokens): there is no gateway to ask."""

    reason = "not-kernelfleet"


class GatewayUnreachable(ClientError):
    """The gateway did not answer at all; ``url`` is the address that was tried."""

    reason = "gateway-unreachable"

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"the kernelfleet gateway at {url} is unreachable: {why}")
        self.url = url


class FleetApiError(ClientError):
    """The gateway answered with an error status; ``reason`` and ``message`` are its own."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{message} ({status} {reason})", reason=reason)
        self.status = status
        self.api_message = message


class FleetClient:
    """Calls the gateway at ``url`` with ``token`` (a kernel token, or the fleet token).

    ``kernel_id`` is the kernel the kernel-scoped calls (`kernel`, `migrate`, `set_gpus`, and
    the filter of `events`) act on; those raise `ValueError` without one. ``timeout`` bounds
    each request, in seconds. The client holds no connection between calls, so it is cheap to
    make and safe to share between threads.
    """

    def __init__(
        self, url: str, token: str, kernel_id: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.url = url.rstrip("/")
        self.kernel_id = kernel_id
        self.timeout = timeout
        self._token = token
        # The gateway is on the fleet's own network: a proxy from the environment is never it.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return f"FleetClient({self.url!r}, kernel_id={self.kernel_id!r})"

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> FleetClient:
        """The client of the kernel this code runs in, from the variables the host agent sets
        in every replica (`environ`: ``os.environ`` by default). Raises `NotAFleetKernel`
        naming what is missing when they are not all there."""
        env = os.environ if environ is None else environ
        names = (GATEWAY_URL_VARIABLE, KERNEL_TOKEN_VARIABLE, ReplicaEnv.KERNEL_ID.value)
        missing = [name for name in names if not env.get(name)]
        if missing:
            raise NotAFleetKernel(
                f"this kernel is not run by kernelfleet ({', '.join(missing)} not set)"
            )
        return cls(
            env[GATEWAY_URL_VARIABLE],
            env[KERNEL_TOKEN_VARIABLE],
            kernel_id=env[ReplicaEnv.KERNEL_ID.value],
            timeout=timeout,
        )

    # ---- the admin API ---------------------------------------------------------------------

    def fleet(self) -> dict[str, Any]:
        """``GET /api/fleet``: the gateway's version, policy and replicas per kernel, host and
        GPU counts, and the autoscaler's state."""
        return self._call("GET", "/api/fleet")

    def hosts(self) -> list[dict[str, Any]]:
        """``GET /api/fleet/hosts``: every host with its state and GPU counts."""
        return self._call("GET", "/api/fleet/hosts")

    def kernel(self) -> dict[str, Any]:
        """``GET /api/fleet/kernels/{id}``: this kernel's replicas, executor, GPUs and last
        cells."""
        return self._call("GET", self._kernel_path())

    def migrate(self, host: str | None = None) -> dict[str, Any]:
        """Move this kernel's executor replica to `host` (None: where the policy places it).
        Returns ``{"state", "replica_id", "from_host", "to_host"}``: ``state`` is ``done``, or
        ``scheduled`` while a cell of the kernel runs (as when this is called from a cell): the
        replica then moves once that cell ends. An unknown host raises `FleetApiError` 404
        ``not-found``, a host already holding a replica 409."""
        body = {} if host is None else {"host": host}
        return self._call("POST", self._kernel_path("/migrate"), body)

    def set_gpus(self, gpus: int) -> dict[str, Any]:
        """Make `gpus` this kernel's GPU count for its later cells; returns the kernel model.
        More than any host has raises `FleetApiError` 400 ``invalid-request``."""
        return self._call("PUT", self._kernel_path("/gpus"), {"gpus": gpus})

    def gpu_settings(self) -> dict[str, Any]:
        """``GET /api/fleet/kernels/{id}/gpu-settings``: the clocks and power limits of the GPUs
        this kernel's running cell holds, with their defaults and ranges: ``{"kernel_id",
        "host_id", "cell_id", "devices": [{"uuid", "index", "current", "default", "ranges",
        "changed"}, ...]}``. No running cell holding GPUs raises `FleetApiError` 409
        ``no-gpus-bound``."""
        return self._call("GET", self._kernel_path("/gpu-settings"))

    def set_gpu_settings(
        self,
        *,
        gpu_clock_mhz: int | None = None,
        mem_clock_mhz: int | None = None,
        power_limit_w: float | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Lock the GPU and/or memory clock (MHz) and/or set the power limit (W) of every GPU
        this kernel's running cell holds, all or nothing, until the cell ends (its host agent
        resets them then, however it ends). `dry_run`: change nothing, answer the NVML calls.
        Returns ``{..., "dry_run", "devices": [{"uuid", "index", "applied", "calls"}]}``.
        Errors (`FleetApiError`): 400 ``invalid-request`` (a value outside the ranges; the
        message lists what is supported), 403 ``permission-denied`` (the host may not change
        them: nothing changed), 409 ``no-gpus-bound``."""
        knobs = {"gpu_clock_mhz": gpu_clock_mhz, "mem_clock_mhz": mem_clock_mhz,
                 "power_limit_w": power_limit_w}  # fmt: skip
        body: dict[str, Any] = {name: value for name, value in knobs.items() if value is not None}
        if dry_run:
            body["dry_run"] = True
        return self._call("PUT", self._kernel_path("/gpu-settings"), body)

    def reset_gpu_settings(self) -> None:
        """Put the clocks and power limits of this kernel's bound GPUs back to their defaults
        now (a cell's end does it anyway)."""
        self._call("DELETE", self._kernel_path("/gpu-settings"))

    def start_workers(
        self,
        count: int,
        module: str,
        *,
        gpus_each: int = 1,
        args: Sequence[str] = (),
        args_each: Sequence[Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``POST /api/fleet/kernels/{id}/workers``: start `count` tool workers (``python -m
        module``, an allowed module) of `gpus_each` GPUs each, on any hosts, for this kernel's
        running cell; worker i gets `args` then ``args_each[i]``, and `env` (allowed names
        only). Returns the group: ``{"id", "state", "workers": [{"id", "index", "host",
        "devices", "state", "exit_code", "log_tail"}, ...], ...}``. Errors (`FleetApiError`):
        400 (a module or env name not allowed), 409 (no running cell; or too many GPUs, the
        message naming the counts)."""
        body: dict[str, Any] = {"count": count, "gpus_each": gpus_each, "module": module,
                                "args": list(args), "env": dict(env or {})}  # fmt: skip
        if args_each is not None:
            body["args_each"] = [list(each) for each in args_each]
        return self._call("POST", self._kernel_path("/workers"), body)

    def workers(self, group_id: str | None = None, all_logs: bool = False) -> Any:
        """This kernel's groups of tool workers (a list), or one group with the log tails of
        its workers that exited (of all of them, fetched from their hosts, with `all_logs`)."""
        suffix = "" if group_id is None else f"/{quote(group_id, safe='')}"
        query = "?logs=all" if all_logs and group_id is not None else ""
        return self._call("GET", self._kernel_path(f"/workers{suffix}{query}"))

    def stop_workers(self, group_id: str) -> dict[str, Any]:
        """End a group of tool workers (SIGTERM, grace, SIGKILL); returns it, ended."""
        return self._call("DELETE", self._kernel_path(f"/workers/{quote(group_id, safe='')}"))

    def events(self, n: int = 20) -> list[dict[str, Any]]:
        """The last `n` fleet events, oldest first; only this kernel's when the client has a
        kernel id (a kernel token sees no others)."""
        query: dict[str, Any] = {"n": n}
        if self.kernel_id is not None:
            query["kernel"] = self.kernel_id
        return self._call("GET", f"/api/fleet/events?{urlencode(query)}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One call of any admin-API route: `method` on `path` (from ``/api/...``, its query
        included), `body` sent as JSON when not None; returns the decoded JSON answer (None for
        an empty one). The libraries over other parts of the API (`kernelfleet.jobs`) are
        built on it; errors are those of every call."""
        return self._call(method, path, body)

    # ---- plumbing --------------------------------------------------------------------------

    def _kernel_path(self, suffix: str = "") -> str:
        if self.kernel_id is None:
            raise ValueError("this FleetClient has no kernel_id: pass one to act on a kernel")
        return f"/api/fleet/kernels/{quote(self.kernel_id, safe='')}{suffix}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        url = self.url + path
        headers = {"Authorization": f"token {self._token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            raise _api_error(e.code, _read(e)) from None
        except urllib.error.URLError as e:
            raise GatewayUnreachable(self.url, self._why(e.reason)) from None
        except (OSError, http.client.HTTPException) as e:
            raise GatewayUnreachable(self.url, self._why(e)) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise FleetApiError(
                status, "bad-response", "the gateway's answer is not JSON"
            ) from None

    def _why(self, reason: object) -> str:
        """Why a request got no answer, in a few words."""
        if isinstance(reason, TimeoutError):
            return f"no answer within {self.timeout:g} s"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror
        return str(reason) or type(reason).__name__


def _read(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read()
    except (OSError, http.client.HTTPException):
        return b""


def _api_error(status: int, raw: bytes) -> FleetApiError:
    """The error a gateway's error answer stands for: its JSON ``{"reason", "message"}``, or
    the start of whatever else it sent (a proxy's page, say)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("reason"), str):
        return FleetApiError(status, body["reason"], str(body.get("message", "")))
    text = raw.decode("utf-8", "replace").strip()[:200] or http.client.responses.get(status, "")
    return FleetApiError(status, "http-error", text)
