"""``HostAgentClient``: how the gateway calls one host agent's API.

Every method is a coroutine. A domain error answered by the agent comes back as the same
``FleetError`` subclass (found by its ``reason``) with the agent's message. Anything that is not
a domain answer -- the agent cannot be reached, times out, rejects the token, fails internally --
raises ``HostUnavailable`` naming the agent's address.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from kernelfleet.errors import FleetError, HostUnavailable

DEFAULT_LAUNCH_TIMEOUT = 40.0


def _error_classes() -> dict[str, type[FleetError]]:
    found: dict[str, type[FleetError]] = {}
    pending: list[type[FleetError]] = [FleetError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.reason, cls)
        pending.extend(cls.__subclasses__())
    return found


class HostAgentClient:
    """Calls the host agent at ``address`` (``http://ip:port``) with ``token``.

    ``request_timeout`` bounds quick calls. Starts and restarts wait for the kernel, so their
    timeout is the launch timeout (the call's, else ``KERNEL_LAUNCH_TIMEOUT`` in its env, else
    ``launch_timeout``) plus ``launch_margin`` seconds, and so outlasts the agent's own.
    Connections come from a client of this object's own, created on first use on the running
    event loop; ``close()`` releases it.
    """

    def __init__(
        self,
        address: str,
        token: str,
        request_timeout: float = 10.0,
        *,
        launch_timeout: float = DEFAULT_LAUNCH_TIMEOUT,
        launch_margin: float = 15.0,
        max_clients: int = 64,
    ) -> None:
        self.address = address.rstrip("/")
        self.request_timeout = request_timeout
        self.launch_timeout = launch_timeout
        self.launch_margin = launch_margin
        self._token = token
        self._max_clients = max_clients
        self._http: AsyncHTTPClient | None = None

    def __repr__(self) -> str:
        return f"HostAgentClient({self.address!r})"

    # -- the API ----------------------------------------------------------------------------

    async def host_info(self) -> dict[str, Any]:
        """``GET /api/host``: ``{"id", "address", "gpus", "replicas"}``."""
        result: dict[str, Any] = await self._call("GET", "/api/host")
        return result

    async def start_replica(
        self,
        replica_id: str,
        kernel_id: str,
        kernel_name: str,
        env: dict[str, str] | None = None,
        launch_timeout: float | None = None,
        raft: bool = False,
        kernel_token: str | None = None,
    ) -> dict[str, Any]:
        """Launch a replica; returns its model once the kernel answered ``kernel_info``.

        With `raft`, the host reserves a Raft port for it (``raft_address`` in the model).
        `kernel_token`, the kernel's own token, goes into the replica's environment (never
        into its model).

        Raises ``NotFound`` (unknown kernelspec), ``Conflict`` (replica id in use),
        ``InvalidRequest``, ``KernelStartFailed`` (message: the kernel's output tail) or
        ``HostUnavailable``.
        """
        env = dict(env or {})
        body = {
            "replica_id": replica_id,
            "kernel_id": kernel_id,
            "kernel_name": kernel_name,
            "env": env,
            "launch_timeout": launch_timeout,
            "raft": raft,
        }
        if kernel_token is not None:
            body["kernel_token"] = kernel_token
        result: dict[str, Any] = await self._call(
            "POST", "/api/replicas", body, budget=self._launch_budget(launch_timeout, env)
        )
        return result

    async def list_replicas(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("GET", "/api/replicas")
        return result

    async def get_replica(self, replica_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", self._replica_path(replica_id))
        return result

    async def interrupt_replica(self, replica_id: str) -> None:
        await self._call("POST", self._replica_path(replica_id, "interrupt"), {})

    async def restart_replica(
        self, replica_id: str, launch_timeout: float | None = None
    ) -> dict[str, Any]:
        """Restart a replica's process; returns its model once the new process is ready."""
        result: dict[str, Any] = await self._call(
            "POST",
            self._replica_path(replica_id, "restart"),
            {"launch_timeout": launch_timeout},
            budget=self._launch_budget(launch_timeout, {}),
        )
        return result

    async def stop_replica(self, replica_id: str) -> None:
        """Shut a replica down and make the agent forget it."""
        await self._call("DELETE", self._replica_path(replica_id))

    async def start_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/jobs``: launch a job process (body: the agent's ``JobRequest``)."""
        result: dict[str, Any] = await self._call("POST", "/api/jobs", body)
        return result

    async def stop_job(self, job_id: str, grace: float) -> dict[str, Any]:
        """SIGTERM, `grace` seconds, SIGKILL; returns the job's model once it exited."""
        path = f"/api/jobs/{quote(job_id, safe='')}/stop"
        result: dict[str, Any] = await self._call(
            "POST", path, {"grace": grace}, budget=grace + self.launch_margin
        )
        return result

    async def job_log(self, job_id: str, tail: int) -> list[str]:
        path = f"/api/jobs/{quote(job_id, safe='')}/log?tail={int(tail)}"
        result: dict[str, Any] = await self._call("GET", path)
        return list(result.get("lines", []))

    async def forget_job(self, job_id: str) -> None:
        """Drop an exited job (and its log) from the agent."""
        await self._call("DELETE", f"/api/jobs/{quote(job_id, safe='')}")

    async def start_worker(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/workers``: launch a tool worker (body: the agent's ``WorkerRequest``)."""
        result: dict[str, Any] = await self._call("POST", "/api/workers", body)
        return result

    async def stop_worker(self, worker_id: str, grace: float) -> dict[str, Any]:
        """SIGTERM, `grace` seconds, SIGKILL; returns the worker's model once it exited."""
        path = f"/api/workers/{quote(worker_id, safe='')}/stop"
        result: dict[str, Any] = await self._call(
            "POST", path, {"grace": grace}, budget=grace + self.launch_margin
        )
        return result

    async def worker_log(self, worker_id: str, tail: int) -> list[str]:
        path = f"/api/workers/{quote(worker_id, safe='')}/log?tail={int(tail)}"
        result: dict[str, Any] = await self._call("GET", path)
        return list(result.get("lines", []))

    async def forget_worker(self, worker_id: str) -> None:
        """Drop an exited tool worker (and its log) from the agent."""
        await self._call("DELETE", f"/api/workers/{quote(worker_id, safe='')}")

    async def gpu_settings(self, uuids: list[str]) -> list[dict[str, Any]]:
        """``GET /api/gpu-settings``: each device's current, default and changed settings,
        its ranges and its owner."""
        query = "&".join(f"uuid={quote(uuid, safe='')}" for uuid in uuids)
        result: dict[str, Any] = await self._call("GET", f"/api/gpu-settings?{query}")
        return list(result["devices"])

    async def set_gpu_settings(
        self,
        uuids: list[str],
        owner: dict[str, Any],
        settings: dict[str, Any],
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        """``PUT /api/gpu-settings``: change `uuids` for `owner` (``{"kernel_id", "binding",
        "replica_id"}``), all or nothing; per device ``{"uuid", "index", "applied", "calls"}``.
        Raises ``PermissionDenied`` (NVML refused: nothing stays changed), ``InvalidRequest``
        (a value out of range), ``Conflict`` (the replica does not run there) or
        ``HostUnavailable``."""
        body = {"uuids": uuids, "owner": owner, "settings": settings, "dry_run": dry_run}
        result: dict[str, Any] = await self._call("PUT", "/api/gpu-settings", body)
        return list(result["devices"])

    async def reset_gpu_settings(
        self,
        uuids: list[str] | None = None,
        kernel_id: str | None = None,
        binding: str | None = None,
    ) -> list[dict[str, Any]]:
        """``POST /api/gpu-settings/reset``: back to the defaults, the devices changed for
        `kernel_id` (and `binding`) among `uuids`; per device the calls made."""
        body = {"uuids": uuids, "kernel_id": kernel_id, "binding": binding}
        result: dict[str, Any] = await self._call("POST", "/api/gpu-settings/reset", body)
        return list(result["devices"])

    def close(self) -> None:
        """Release the connections; the next call opens new ones."""
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- plumbing ---------------------------------------------------------------------------

    def _launch_budget(self, launch_timeout: float | None, env: dict[str, str]) -> float:
        if launch_timeout is None:
            try:
                launch_timeout = float(env["KERNEL_LAUNCH_TIMEOUT"])
            except (KeyError, ValueError):
                launch_timeout = self.launch_timeout
        return launch_timeout + self.launch_margin

    @staticmethod
    def _replica_path(replica_id: str, action: str | None = None) -> str:
        path = f"/api/replicas/{quote(replica_id, safe='')}"
        return f"{path}/{action}" if action else path

    async def _call(
        self, method: str, path: str, body: Any = None, *, budget: float | None = None
    ) -> Any:
        if self._http is None:
            self._http = AsyncHTTPClient(force_instance=True, max_clients=self._max_clients)
        timeout = budget or self.request_timeout
        request = HTTPRequest(
            self.address + path,
            method=method,
            headers={"Authorization": f"token {self._token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            connect_timeout=min(timeout, self.request_timeout),
            request_timeout=timeout,
        )
        try:
            response = await self._http.fetch(request)
        except HTTPClientError as e:
            raise self._error_from(method, path, e) from None
        except OSError as e:
            raise HostUnavailable(
                f"host agent at {self.address} cannot be reached ({method} {path}): {e}"
            ) from None
        return json.loads(response.body) if response.body else None

    def _error_from(self, method: str, path: str, error: HTTPClientError) -> FleetError:
        where = f"host agent at {self.address} ({method} {path})"
        if error.code == 599 or error.response is None:
            return HostUnavailable(f"{where} did not answer: {error}")
        try:
            payload = json.loads(error.response.body)
            reason, message = str(payload["reason"]), str(payload["message"])
        except (ValueError, KeyError, TypeError):
            return HostUnavailable(f"{where} answered HTTP {error.code} without a JSON error")
        cls = _error_classes().get(reason)
        if cls is None or cls is FleetError:
            return HostUnavailable(f"{where} answered HTTP {error.code} {reason}: {message}")
        return cls(message)
