"""One kernel process that a host agent launches: as which user, in which folders, and
waiting on it until it answers, or exits.

**As which user.** `choose_isolation` decides once, at agent start, whether replicas run as a
user of their own kernel (`Isolation.per_kernel`: the agent runs as root, and such a user can
run the interpreter and reach kernelfleet's files and the agent's replica folders) or as the
agent's own user. `ReplicaFolders` lays out a replica's folder for its user, and
`ReplicaKernelManager` hands it the connection file.

**Waiting.** A replica's kernel is ready once it answers ``kernel_info``; it failed to start if
its process exits first, if its log says a port was taken (ipykernel then hangs rather than
exit), or if neither happens in time. `wait_ready` raises `StartError` saying which.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib.util
import logging
import os
import pwd
import queue
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from kernelfleet.errors import HostUnavailable
from kernelfleet.privileges import kernel_uid, unreachable
from kernelfleet.protocol import ReplicaEnv

_log = logging.getLogger("kernelfleet.host.replicas")

PORT_TAKEN = "Address already in use"
KERNEL_LOG = "kernel.log"
KERNEL_UMASK = 0o077
"""Files a per-kernel user creates are its own: the replicas of other kernels read none."""


class KernelUser(enum.Enum):
    """The host agent's ``--kernel-user`` choice."""

    AUTO = "auto"
    """A user of its own per kernel where the agent can (root, and every file reachable)."""
    SAME = "same"
    """The agent's own user, always."""


@dataclass(frozen=True)
class Isolation:
    """Which user the agent's replicas run as, and why; fixed for the agent's life."""

    per_kernel: bool
    why: str
    warning: str = ""
    """What is wrong and what to do, when `KernelUser.AUTO` could not isolate kernels."""

    def owner(self, kernel_id: str) -> tuple[int, int] | None:
        """The (uid, gid) the replicas of `kernel_id` run as; None: the agent's own."""
        if not self.per_kernel:
            return None
        uid = kernel_uid(kernel_id)
        return uid, uid

    def model(self) -> dict[str, Any]:
        """The ``isolation`` member of the host model (``GET /api/host``, heartbeats)."""
        return {"kernel_user": "per-kernel" if self.per_kernel else "agent", "why": self.why}


def choose_isolation(requested: KernelUser, replicas_dir: Path) -> Isolation:
    """Decide, once at agent start, whether replicas run as users of their own kernels.

    `KernelUser.AUTO` isolates them when the agent runs as root on Linux and a user with no
    rights of its own can run the interpreter, read kernelfleet's and ipykernel's files and
    traverse to `replicas_dir`; otherwise the result carries a `warning` naming what is in the
    way and what to do, and replicas run as the agent's user."""
    if requested is KernelUser.SAME:
        return Isolation(False, "--kernel-user=same: kernels run as the agent's user")
    user = _user_name(os.geteuid()) if hasattr(os, "geteuid") else "this user"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        why = f"the agent runs as {user}, not root, so kernels run as {user} too"
        advice = (
            "a notebook can then read this user's files; run the agent as root to give each "
            "kernel a user of its own, or pass --kernel-user=same to say that this is meant"
        )
        return Isolation(False, why, f"{why}: {advice}")
    problems = unreachable(_launch_paths(replicas_dir))
    if problems:
        why = "a kernel's own user could not start its replicas: " + "; ".join(problems)
        advice = (
            f"Kernels run as {user} instead, where a notebook can read every file of the "
            "machine. Let other users traverse those folders (chmod o+x, which lists nothing) "
            "or install Python and kernelfleet where every user can read them, and give the "
            "agent a --state-dir that others can traverse; or pass --kernel-user=same to run "
            "kernels as root knowingly"
        )
        return Isolation(False, why, f"{why}. {advice}")
    return Isolation(True, "each kernel runs as a user of its own (a uid derived from its id)")


def _launch_paths(replicas_dir: Path) -> list[tuple[str | Path, str]]:
    """What a replica's process must reach: the interpreter, the standard library, ipykernel,
    kernelfleet (the replica kernel's package and its linked folders) and its own folder."""
    paths: list[tuple[str | Path, str]] = [
        (sys.executable, "x"),
        (Path(os.__file__).parent, "r"),
        (Path(__file__).resolve().parent.parent / "replica", "r"),
        (Path(__file__).resolve().parent.parent.parent, "r"),
        (replicas_dir, "x"),
    ]
    ipykernel = importlib.util.find_spec("ipykernel")
    if ipykernel is not None and ipykernel.origin:
        paths.append((Path(ipykernel.origin).parent, "r"))
    return paths


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def account_of(uid: int) -> str | None:
    """The name of the system account with `uid`, if there is one."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@dataclass(frozen=True)
class ReplicaFolders:
    """A replica's folder, ``<state_dir>/replicas/<replica id>``, laid out for its user.

    The folder itself stays the agent's (mode 0711: its user may enter, nobody may list it),
    with ``kernel.log`` (the agent's, 0600; the kernel writes it through the descriptor it
    inherits) and ``connection.json`` (given to the kernel's user). ``home/`` (HOME, TMPDIR,
    IPYTHONDIR, the XDG folders), ``raft/`` (the Raft journal) and ``work/`` (the kernel's working
    directory when the one it asked for is not writable by its user: `ReplicaTable` decides)
    belong to the kernel's user, mode 0700. The agent never follows a path inside them: a
    replica could have put links there.
    """

    directory: Path
    owner: tuple[int, int] | None

    @property
    def home(self) -> Path:
        return self.directory / "home"

    @property
    def work(self) -> Path:
        """The kernel's private working directory (made by `prepare` for a kernel's own user)."""
        return self.directory / "work"

    @property
    def user_site(self) -> Path:
        """Where ``pip install --user`` puts packages for this interpreter (``site``'s user
        site-packages under ``home/``). Made in advance: Python puts it on ``sys.path`` at start
        only if it exists, and ``%pip install`` in a kernel that cannot write the environment
        installs there (so the running kernel imports what it installed)."""
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.home / ".local" / "lib" / version / "site-packages"

    def prepare(self) -> dict[str, str]:
        """Create the folders (for `owner`, if any); return the environment that points the
        kernel's per-user files into ``home/`` (nothing when the kernel runs as the agent)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.owner is None:
            return {}
        self.directory.chmod(0o711)
        home = self.home
        env = {
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "IPYTHONDIR": str(home / ".ipython"),
            "MPLCONFIGDIR": str(home / ".config" / "matplotlib"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "XDG_RUNTIME_DIR": str(home / ".run"),
            "USER": f"kernel-{self.owner[0]}",
            "LOGNAME": f"kernel-{self.owner[0]}",
        }
        subfolders = [Path(env[name]) for name in ("TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                                                   "XDG_DATA_HOME", "XDG_STATE_HOME",
                                                   "XDG_RUNTIME_DIR")]  # fmt: skip
        self._own(home, [*subfolders, self.user_site])
        self._own(self.directory / "raft", [])
        self._own(self.work, [])
        return env

    def _own(self, folder: Path, inside: list[Path]) -> None:
        """Make `folder` (and, when new, `inside` it) the owner's, mode 0700. A folder left by
        another user (an earlier replica of this id, of another kernel) is removed first."""
        assert self.owner is not None
        try:
            found = os.lstat(folder)
        except FileNotFoundError:
            found = None
        if found is not None and found.st_uid == self.owner[0] and os.path.isdir(folder):
            return  # the owner's already: what is inside is its own business
        if found is not None:
            if os.path.isdir(folder) and not os.path.islink(folder):
                shutil.rmtree(folder)  # fd-based on Linux: never follows the links inside
            else:
                folder.unlink()
        # Created while still the agent's, then given away from the bottom up: the kernel's
        # user can place nothing here before the folder is its own.
        folder.mkdir(mode=0o700)
        for sub in inside:
            sub.mkdir(mode=0o700, parents=True, exist_ok=True)
        for below, folders, _files in os.walk(folder, topdown=False):
            for name in folders:
                os.chown(os.path.join(below, name), *self.owner, follow_symlinks=False)
        os.chown(folder, *self.owner, follow_symlinks=False)


class ReplicaKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, which also hands the connection file to the replica's
    user (`owner`, set before the launch) each time it writes it: the file is created 0600."""

    owner: tuple[int, int] | None = None

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        if self.owner is not None:
            os.chown(self.connection_file, *self.owner, follow_symlinks=False)

    def launch_options(self) -> dict[str, Any]:
        """What `start_kernel` passes on to ``Popen`` to run the kernel as `owner`."""
        if self.owner is None:
            return {}
        uid, gid = self.owner
        return {"user": uid, "group": gid, "extra_groups": [], "umask": KERNEL_UMASK}


class StartError(Exception):
    """Why a kernel did not become ready (the replica table turns it into ``KernelStartFailed``)."""


async def process_exit_code(km: AsyncKernelManager) -> int | None:
    """The process's exit code, or None while it runs (or if it was never launched)."""
    provisioner = km.provisioner
    if provisioner is None or not provisioner.has_process:
        return None
    code = await provisioner.poll()
    return code if isinstance(code, int) else None


async def _wait_exit(km: AsyncKernelManager, interval: float = 0.05) -> int | None:
    """The exit code, once the process has exited. A poll that fails (a container engine
    answering 500 under load) says nothing of the process: polled again; an engine that
    cannot be reached (`HostUnavailable`) ends the wait."""
    while True:
        try:
            code = await process_exit_code(km)
        except HostUnavailable:
            raise
        except Exception as e:
            _log.debug("polling a starting kernel failed (polled again): %s", e)
            code = None
        if code is not None:
            return code
        await asyncio.sleep(interval)


async def _kernel_info_answered(kc: Any) -> None:
    """Ask for ``kernel_info`` (again each second) until the kernel replies.

    Not ``wait_for_ready``: that also waits for IOPub and restarts after 0.2 s of silence there,
    which costs a quarter of a second per start; the gateway confirms IOPub itself when it links.
    """
    while True:
        msg_id = kc.kernel_info()
        try:
            while (await kc.get_shell_msg(timeout=1.0))["parent_header"].get("msg_id") != msg_id:
                pass
            return
        except queue.Empty:
            continue


async def wait_ready(
    km: AsyncKernelManager, ready_within: float, log_text: Callable[[], str] = str
) -> None:
    """Return once the kernel answered ``kernel_info``; raise ``StartError`` as soon as the
    process exits, its log (`log_text`) says a port was taken (ipykernel then hangs rather
    than exit), or when ``ready_within`` seconds pass."""
    kc = km.client(context=km.context)  # a context of its own would block as it ends
    kc.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    ready = asyncio.ensure_future(_kernel_info_answered(kc))
    exited = asyncio.ensure_future(_wait_exit(km))
    port_taken = asyncio.ensure_future(_wait_for_text(log_text, PORT_TAKEN))
    try:
        done, _ = await asyncio.wait(
            {ready, exited, port_taken}, timeout=ready_within, return_when=asyncio.FIRST_COMPLETED
        )
        if ready in done and ready.exception() is None:
            return
        if port_taken in done:
            raise StartError(f"could not bind its ports ({PORT_TAKEN})")
        if exited in done and exited.exception() is not None:
            raise StartError(f"could not be watched while it started: {exited.exception()}")
        code = await process_exit_code(km)
        if code is not None:
            raise StartError(f"exited with code {code} before it was ready")
        if ready in done:
            raise StartError(f"did not become ready: {ready.exception()}")
        raise StartError(f"did not answer kernel_info within {ready_within:g} s")
    finally:
        for task in (ready, exited, port_taken):
            task.cancel()
        await asyncio.gather(ready, exited, port_taken, return_exceptions=True)
        kc.stop_channels()


async def _wait_for_text(text: Callable[[], str], wanted: str, interval: float = 0.2) -> None:
    """Return once `wanted` appears in `text()` (a log file written by another process, so
    polled: nothing in this process could signal it)."""
    while True:
        if wanted in text():
            return
        await asyncio.sleep(interval)


def remove_replica_folder(directory: Path, *, keep_log: bool = False) -> None:
    """Remove a replica's folder once its process is gone; with `keep_log`, all but its
    ``kernel.log`` (the agent's own file). Never follows a link the kernel may have placed
    (``shutil.rmtree`` is fd-based on Linux), and removes what a same-user kernel made
    read-only. Never raises: what cannot be removed is logged."""
    try:
        found = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as e:
        _log.warning("cannot remove replica folder %s: %s", directory, e)
        return
    if not stat.S_ISDIR(found.st_mode):
        return
    try:
        if not keep_log:
            shutil.rmtree(directory, onerror=_force_writable)
            return
        for entry in os.scandir(directory):
            if entry.name == KERNEL_LOG:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=_force_writable)
            else:
                os.unlink(entry.path)
    except OSError as e:
        _log.warning("cannot remove replica folder %s: %s", directory, e)


def _force_writable(_function: Callable[..., Any], path: str, _exc_info: Any) -> None:
    """rmtree's error handler: a same-user kernel may have made a folder read-only or
    unlistable. Make it and its parent the agent's to change again (never through a link)
    and remove `path` once more; a second failure raises."""
    for folder in (os.path.dirname(path), path):
        if os.path.isdir(folder) and not os.path.islink(folder):
            with contextlib.suppress(OSError):
                os.chmod(folder, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_give_up)
    else:
        os.unlink(path)


def _give_up(_function: Callable[..., Any], path: str, exc_info: Any) -> None:
    raise exc_info[1]


def replica_dirs_in_use(proc: Path = Path("/proc")) -> set[str]:
    """The replica folders (`ReplicaEnv.REPLICA_DIR`) of the processes running on this
    machine, read from ``/proc/<pid>/environ`` (the agent runs as root or as its kernels'
    user, so it may read theirs); empty where there is no ``/proc``."""
    marker = f"{ReplicaEnv.REPLICA_DIR.value}=".encode()
    found: set[str] = set()
    try:
        pids = [entry for entry in os.listdir(proc) if entry.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            environ = (proc / pid / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(marker):
                found.add(item[len(marker) :].decode(errors="replace"))
    return found


def sweep_replica_folders(
    replicas_dir: Path,
    *,
    keep: Iterable[str] = (),
    in_use: set[str] | None = None,
    keep_logs_s: float = 0.0,
    min_age_s: float = 0.0,
    now: float | None = None,
) -> list[str]:
    """Remove the folders under `replicas_dir` of replicas no process runs (at agent start:
    those of an agent that died, whose kernels exited with it); return their names.

    Folders named in `keep` (this agent's own replicas) and those a running process points to
    (`in_use`, by default `replica_dirs_in_use`) stay, and so do folders changed less than
    `min_age_s` seconds ago (a replica starting now may not be in `keep` yet). A folder whose
    ``kernel.log`` changed less than `keep_logs_s` seconds ago keeps that log alone."""
    in_use = replica_dirs_in_use() if in_use is None else in_use
    now = time.time() if now is None else now
    kept = set(keep)
    removed: list[str] = []
    try:
        entries = list(os.scandir(replicas_dir))
    except OSError:
        return removed
    for entry in entries:
        if entry.name in kept or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.path in in_use or str(Path(entry.path).resolve()) in in_use:
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
        except OSError:
            continue
        try:
            age = now - os.lstat(os.path.join(entry.path, KERNEL_LOG)).st_mtime
        except OSError:
            age = float("inf")
        keep_log = age < keep_logs_s
        if keep_log and {e.name for e in os.scandir(entry.path)} <= {KERNEL_LOG}:
            continue  # only a log still kept
        remove_replica_folder(Path(entry.path), keep_log=keep_log)
        removed.append(entry.name)
    return removed
