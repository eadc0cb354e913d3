"""What a host agent needs to run replicas in containers: its engine, the labels that mark its
containers, what every container mounts, and the containers a previous agent left running."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
from jupyter_client.manager import AsyncKernelManager

from kernelfleet.kernels.agent.containers.engine import (
    LABEL_HOST,
    LABEL_KERNEL,
    LABEL_KERNELSPEC,
    LABEL_OWNER,
    LABEL_RAFT,
    LABEL_REPLICA,
    LABEL_STATE_DIR,
    UNREACHABLE,
    Engine,
    is_gone,
    list_containers,
)
from kernelfleet.kernels.agent.containers.provisioner import ContainerProvisioner
from kernelfleet.kernels.agent.containers.spec import ContainerSpec


@dataclass(frozen=True)
class FoundContainer:
    """A replica container of this agent that the engine lists (at agent start)."""

    container_id: str
    name: str
    running: bool
    replica_id: str
    kernel_id: str
    kernel_name: str
    raft_address: str
    owner: tuple[int, int] | None
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """The container's environment (a restart of the adopted replica starts with it again)."""
    working_dir: str = ""


@dataclass
class ContainerRuntime:
    """One agent's container settings; `provisioner` makes each replica's provisioner."""

    engine: Engine
    host_id: str
    state_dir: Path
    mounts: list[str] = field(default_factory=list)
    """Host folders every container mounts at the same path (the object store root)."""
    gpu_uuids: list[str] = field(default_factory=list)
    """The host's NVIDIA GPUs, given to containers as device requests (none: no GPUs)."""

    def container_name(self, replica_id: str) -> str:
        return f"kernelfleet-{self.host_id}-{replica_id}"

    def provisioner(
        self,
        km: AsyncKernelManager,
        spec: ContainerSpec,
        *,
        replica_id: str,
        kernel_id: str,
        raft_address: str | None,
        owner: tuple[int, int] | None,
        binds: list[str],
        log_sink: Callable[[bytes], None] | None,
    ) -> ContainerProvisioner:
        """The provisioner of one replica's container (set as ``km.provisioner``)."""
        provisioner = ContainerProvisioner(
            kernel_id=kernel_id, kernel_spec=km.kernel_spec, parent=km
        )
        labels = {
            LABEL_HOST: self.host_id,
            LABEL_STATE_DIR: str(self.state_dir),
            LABEL_KERNEL: kernel_id,
            LABEL_REPLICA: replica_id,
            LABEL_KERNELSPEC: km.kernel_name,
            LABEL_RAFT: raft_address or "",
            LABEL_OWNER: "" if owner is None else f"{owner[0]}:{owner[1]}",
        }
        provisioner.configure(
            engine=self.engine,
            spec=spec,
            name=self.container_name(replica_id),
            labels=labels,
            binds=[*binds, *self.mounts],
            user=None if owner is None else f"{owner[0]}:{owner[1]}",
            gpu_uuids=self.gpu_uuids,
            log_sink=log_sink,
        )
        return provisioner

    def found(self) -> list[FoundContainer]:
        """This agent's replica containers (same host id and state dir), running or not.
        Blocking; `EngineUnavailable` if the engine does not answer."""
        try:
            listed = list_containers(
                self.engine.client(), filters={"label": [f"{LABEL_HOST}={self.host_id}"]}
            )
        except (docker.errors.DockerException, *UNREACHABLE) as e:
            raise self.engine.unavailable(e) from e
        found = []
        for container in listed:
            labels: dict[str, Any] = container.labels or {}
            if labels.get(LABEL_STATE_DIR) != str(self.state_dir):
                continue
            owner_label = str(labels.get(LABEL_OWNER) or "")
            owner = None
            if owner_label:
                uid, gid = owner_label.split(":", 1)
                owner = (int(uid), int(gid))
            found.append(
                FoundContainer(
                    container_id=str(container.id),
                    name=str(container.name),
                    running=container.status == "running",
                    replica_id=str(labels.get(LABEL_REPLICA, "")),
                    kernel_id=str(labels.get(LABEL_KERNEL, "")),
                    kernel_name=str(labels.get(LABEL_KERNELSPEC, "")),
                    raft_address=str(labels.get(LABEL_RAFT, "")),
                    owner=owner,
                    env=_env_of(container.attrs),
                    working_dir=str((container.attrs.get("Config") or {}).get("WorkingDir") or ""),
                )
            )
        return found

    def remove(self, container_id: str) -> None:
        """Remove a container (blocking); one already gone is fine."""
        try:
            self.engine.client().api.remove_container(container_id, force=True)
        except docker.errors.APIError as e:
            if not is_gone(e):
                raise


def _env_of(attrs: dict[str, Any]) -> dict[str, str]:
    """A container's environment (``Config.Env``, ``NAME=value`` strings) as a dict."""
    pairs = (item.split("=", 1) for item in (attrs.get("Config") or {}).get("Env") or [])
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
