"""The host agent's connection to its container engine (Docker, or podman's Docker-compatible
service), through the ``docker`` package.

The engine is reached at ``--container-engine`` (default ``$DOCKER_HOST``, else Docker's own
socket). The connection is made at the first container replica, not at agent start, so an agent
that runs only processes needs no engine. `EngineUnavailable` says which socket failed and why.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import docker
import docker.errors
import requests.exceptions

from kernelfleet.errors import HostUnavailable

DEFAULT_ENGINE = "unix:///var/run/docker.sock"

LABEL_PREFIX = "io.kernelfleet."
LABEL_HOST = LABEL_PREFIX + "host-id"
LABEL_STATE_DIR = LABEL_PREFIX + "state-dir"
LABEL_KERNEL = LABEL_PREFIX + "kernel-id"
LABEL_REPLICA = LABEL_PREFIX + "replica-id"
LABEL_KERNELSPEC = LABEL_PREFIX + "kernelspec"
LABEL_RAFT = LABEL_PREFIX + "raft-address"
LABEL_OWNER = LABEL_PREFIX + "owner"
"""Labels on every replica container: who runs it (host id and the agent's state dir, so two
agents on one machine tell theirs apart) and what it is, so a restarted agent adopts it."""


class EngineUnavailable(HostUnavailable):
    """The container engine cannot be reached (its socket is gone, or it does not answer)."""


def is_gone(error: BaseException) -> bool:
    """Whether an engine error says the container no longer exists. Docker answers 404; podman
    4 answers 500 "... does not exist in database: no such container" to a container removed
    between a listing and its inspection."""
    if isinstance(error, docker.errors.NotFound):
        return True
    return isinstance(error, docker.errors.APIError) and str(error.explanation or "").endswith(
        "no such container"
    )


def list_containers(client: Any, filters: dict[str, Any]) -> list[Any]:
    """Every container (running or not) that matches `filters`, inspected, leaving out those
    removed while the listing ran. (``client.containers.list`` raises on such a container.)
    Blocking; engine errors other than "gone" propagate."""
    found = []
    for summary in client.api.containers(all=True, filters=filters):
        try:
            found.append(client.containers.get(summary["Id"]))
        except docker.errors.APIError as e:
            if not is_gone(e):
                raise
    return found


def default_engine_url() -> str:
    return os.environ.get("DOCKER_HOST", "").strip() or DEFAULT_ENGINE


class Engine:
    """A lazily made ``docker.DockerClient`` for `url`; every call may block (run it in a
    thread). `client()` raises `EngineUnavailable` naming the socket when it cannot connect."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    client = docker.DockerClient(
                        base_url=self.url, version="auto", timeout=int(self.timeout)
                    )
                except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
                    raise self.unavailable(e) from e
                self._client = client
            return self._client

    def unavailable(self, error: BaseException) -> EngineUnavailable:
        return EngineUnavailable(f"the container engine at {self.url} cannot be reached: {error}")

    def ping(self) -> None:
        """Raise `EngineUnavailable` unless the engine answers now."""
        try:
            self.client().ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise self.unavailable(e) from e

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
"""What a call to an engine that went away raises (its socket removed, or it hangs)."""
