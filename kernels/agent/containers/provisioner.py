"""A jupyter_client kernel provisioner that runs one replica's kernel in a container.

`ReplicaTable` (``kernels.agent.replicas``) sets a `ContainerProvisioner` on a replica's kernel
manager instead of jupyter_client's local one when the kernelspec asks for a container, so the
manager's start, interrupt, restart and shutdown work unchanged; `adopt` gives one a container a
previous agent started.

The container:

- runs the kernelspec's argv in its image, never pulled (a missing image is an error naming it);
- shares the host's network (``network_mode=host``): the replica binds the ZMQ and Raft ports
  the agent chose on the agent's ``--kernel-ip`` and ``--raft-ip``, as a process would, so the
  gateway and the other replicas reach it unchanged; publishing 6 ports per replica would gain
  no isolation from the host's loopback (a process replica has that too) and would need the
  Raft address to name the host's port, not the container's;
- runs as the kernel's own user when the agent isolates kernels (``uid:gid``, no other group),
  with an init process (``init=True``) that forwards signals: ``interrupt`` is SIGINT to the
  kernel, as for a process;
- sees the host's files only where they are mounted, at the same paths: the replica's folder
  (its home, Raft journal, connection file), its working directory and the object store root;
- is limited to the kernelspec's CPUs and memory, and on NVIDIA hosts sees the host's GPUs
  through device requests (see docs/containers.md: not tested here);
- carries labels (`engine.LABEL_*`) naming the agent, kernel and replica, so a restarted agent
  adopts it.

Its output goes to the engine's log; when the container is removed the agent appends that log
to the replica's ``kernel.log``, and `log_tail` reads it while it exists, so a kernel that exits
at once shows the user why.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

import docker.errors
import docker.types
from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from kernelfleet.kernels.agent.containers.engine import UNREACHABLE, Engine, is_gone
from kernelfleet.kernels.agent.containers.spec import ContainerSpec

log = logging.getLogger("kernelfleet.host.containers")

MISSING_COMMAND = ("executable file not found", "no such file or directory")
INIT_EXEC_FAILED = "failed to exec pid1"
"""What an engine says when the image lacks the kernelspec's command (no Python): at start,
or, through the init process (catatonit), in the container's log as it exits."""


class ContainerStartError(Exception):
    """The container could not be created or started; the message names the image."""


class ContainerProvisioner(KernelProvisionerBase):
    """Launches, signals, watches and removes one replica's container (module docstring).

    Set up with `configure` before the kernel manager starts it."""

    engine: Engine
    spec: ContainerSpec
    container_name = ""
    labels: dict[str, str]
    binds: list[str]
    user: str | None = None
    gpu_uuids: list[str]
    log_sink: Callable[[bytes], None] | None = None
    container_id: str | None = None
    exit_reason: str | None = None
    """Why the container ended, when the engine says more than its exit code (its memory
    limit killed it, it was removed by someone else)."""

    def configure(
        self,
        *,
        engine: Engine,
        spec: ContainerSpec,
        name: str,
        labels: dict[str, str],
        binds: list[str],
        user: str | None,
        gpu_uuids: list[str],
        log_sink: Callable[[bytes], None] | None,
    ) -> None:
        """Everything the container needs besides the command, env and cwd the kernel manager
        passes: `binds` are host paths mounted read-write at the same paths."""
        self.engine, self.spec, self.container_name = engine, spec, name
        self.labels, self.binds, self.user = labels, binds, user
        self.gpu_uuids, self.log_sink = gpu_uuids, log_sink

    _killing = False
    """The agent killed it (so a SIGKILL exit is no memory limit's)."""

    def adopt(self, container_id: str) -> None:
        """Take over `container_id`, running already (started by a previous agent)."""
        self.container_id = container_id

    # -- KernelProvisionerBase ------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return self.container_id is not None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        assert km is not None, "a provisioner is made with its kernel manager as parent"
        extra_arguments = kwargs.pop("extra_arguments", [])
        km.write_connection_file()
        self.connection_info = km.get_connection_info()
        cmd = km.format_kernel_cmd(extra_arguments=extra_arguments)
        # jupyter_client puts its own interpreter's path for "python3": the image's is meant.
        cmd[0] = self.kernel_spec.argv[0]
        for popen_only in ("stdout", "stderr", "user", "group", "extra_groups", "umask"):
            kwargs.pop(popen_only, None)
        result: dict[str, Any] = await super().pre_launch(cmd=cmd, **kwargs)
        return result

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        self.exit_reason = None
        self._killing = False
        env = dict(kwargs.get("env") or {})
        self.container_id = await asyncio.to_thread(self._create_and_start, cmd, env,
                                                    kwargs.get("cwd"))  # fmt: skip
        return self.connection_info

    async def poll(self) -> int | None:
        if self.container_id is None:
            return 0
        try:
            state = (await asyncio.to_thread(self._inspect))["State"]
        except docker.errors.APIError as e:
            if not is_gone(e):
                raise
            self.exit_reason = "its container was removed by someone else"
            return 255
        if state.get("Running") or state.get("Status") in ("created", "configured"):
            return None
        code = state.get("ExitCode")
        code = code if isinstance(code, int) else 255
        limit = f"its memory limit ({self.spec.describe_memory()} in the kernelspec)"
        if state.get("OOMKilled"):
            self.exit_reason = f"killed by {limit}"
        elif code == 128 + signal.SIGKILL and self.spec.memory is not None and not self._killing:
            # Podman 4.3.1 (this project's CI) never sets OOMKilled: say what is likely.
            self.exit_reason = (
                f"killed by SIGKILL, which is what {limit} does; the engine does not say "
                "whether it was that or someone else"
            )
        elif code != 0 and self.exit_reason is None:
            tail = await asyncio.to_thread(self.log_tail, 3)
            if INIT_EXEC_FAILED in tail:
                self.exit_reason = self._missing_command(INIT_EXEC_FAILED)
        return code

    def _missing_command(self, why: str) -> str:
        command = self.kernel_spec.argv[0]
        return (
            f"image {self.spec.image!r} cannot run {command!r}: a kernel image needs Python with "
            f"kernelfleet's kernel (`kernelfleet image build --base {self.spec.image}` makes "
            f"one); the engine said: {why}"
        )

    async def wait(self) -> int | None:
        while True:
            code = await self.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.1)

    async def send_signal(self, signum: int) -> None:
        if self.container_id is None:
            return
        try:
            await asyncio.to_thread(self.engine.client().api.kill, self.container_id, signum)
        except docker.errors.APIError as e:
            if await self.poll() is None:  # an error while it still runs is one
                raise
            log.debug("container %s: signal %s after it ended: %s", self.container_name,
                      signum, e)  # fmt: skip

    async def kill(self, restart: bool = False) -> None:
        self._killing = True
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """Append the container's log to the replica's kernel.log, then remove it."""
        if self.container_id is None:
            return
        container_id, self.container_id = self.container_id, None
        await asyncio.to_thread(self._keep_log_and_remove, container_id)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return recommended

    # -- reading --------------------------------------------------------------------------

    def log_tail(self, lines: int) -> str:
        """The last `lines` lines the container wrote (blocking; "" once it is removed)."""
        if self.container_id is None:
            return ""
        try:
            data = self.engine.client().api.logs(
                self.container_id, stdout=True, stderr=True, tail=lines
            )
        except (docker.errors.DockerException, *UNREACHABLE) as e:
            return f"(the container's log could not be read: {e})"
        return bytes(data).decode("utf-8", "replace")

    # -- blocking engine calls (in a thread) ----------------------------------------------

    def _inspect(self) -> dict[str, Any]:
        """The engine's view of the container; `EngineUnavailable` if it does not answer."""
        try:
            result: dict[str, Any] = self.engine.client().api.inspect_container(self.container_id)
        except UNREACHABLE as e:
            raise self.engine.unavailable(e) from e
        return result

    def _create_and_start(self, cmd: list[str], env: dict[str, str], cwd: str | None) -> str:
        try:
            return self._create_and_start_on(self.engine.client(), cmd, env, cwd)
        except UNREACHABLE as e:
            raise self.engine.unavailable(e) from e

    def _create_and_start_on(
        self, client: Any, cmd: list[str], env: dict[str, str], cwd: str | None
    ) -> str:
        image = self.spec.image
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise ContainerStartError(
                f"image {image!r} is not on this host's container engine ({self.engine.url}); "
                "kernelfleet never pulls: build it there with `kernelfleet image build`, or "
                "load it"
            ) from None
        self._remove_leftover(client)
        device_requests = (
            [docker.types.DeviceRequest(driver="nvidia", device_ids=self.gpu_uuids,
                                        capabilities=[["gpu"]])]
            if self.gpu_uuids else []
        )  # fmt: skip
        container = client.containers.create(
            image,
            command=cmd,
            name=self.container_name,
            labels=self.labels,
            environment=env,
            working_dir=cwd,
            user=self.user,
            network_mode="host",
            init=True,
            volumes=[f"{path}:{path}:rw" for path in dict.fromkeys(self.binds)],
            mem_limit=self.spec.memory,
            memswap_limit=self.spec.memory,
            nano_cpus=self.spec.nano_cpus,
            device_requests=device_requests,
            detach=True,
        )
        try:
            container.start()
        except docker.errors.APIError as e:
            why = str(e.explanation or e)
            self._keep_log_and_remove(container.id)
            if any(text in why.lower() for text in MISSING_COMMAND):
                raise ContainerStartError(self._missing_command(why)) from None
            raise ContainerStartError(
                f"the container of image {image!r} did not start: {why}"
            ) from None
        log.info("container %s (%s) started from %s", self.container_name, container.short_id,
                 image)  # fmt: skip
        return str(container.id)

    def _remove_leftover(self, client: Any) -> None:
        """Remove a container of this name that no agent adopted (its replica is gone)."""
        try:
            leftover = client.containers.get(self.container_name)
        except docker.errors.APIError as e:
            if not is_gone(e):
                raise
            return
        log.warning("removing the leftover container %s", self.container_name)
        leftover.remove(force=True)

    def _keep_log_and_remove(self, container_id: str) -> None:
        client = self.engine.client()
        try:
            if self.log_sink is not None:
                data = client.api.logs(container_id, stdout=True, stderr=True)
                self.log_sink(bytes(data))
            client.api.remove_container(container_id, force=True)
        except (docker.errors.DockerException, *UNREACHABLE) as e:
            if is_gone(e):
                return
            log.warning("container %s could not be removed: %s", self.container_name, e)
