"""Keeping the fleet token away from notebook code: per-kernel users and non-dumpable processes.

Two defences, used by the processes that hold the fleet token (the gateway, the host agents and
``kernelfleet up``):

- `mark_non_dumpable` sets ``PR_SET_DUMPABLE`` to 0 (Linux). The kernel then makes the process's
  ``/proc/<pid>/environ``, ``mem``, ``maps``... readable by root only and refuses ptrace from
  processes of the same user, so a kernel that runs as the same OS user cannot read the token
  from the process's environment or memory. The flag is reset by ``execve``: children that the
  process launches (kernels) are ordinary processes again.
- A host agent that runs as root launches each replica as a user of its own kernel:
  `kernel_uid` derives a uid (used as the gid too) from the kernel id, so the replicas of one
  kernel share it on every host, and no account of the system has it. `unreachable` tells
  whether such a user can run the interpreter and read kernelfleet's files at all, and
  `not_writable_by` whether it can create files in a folder (the kernel's working directory).

This module imports nothing from kernelfleet: every process may use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

KERNEL_UID_FIRST = 2**24
"""The lowest uid a kernel can get: above the ranges that distributions give accounts."""
KERNEL_UID_COUNT = 2**31 - 2**24
"""How many uids kernels draw from: ``KERNEL_UID_FIRST`` up to 2**31 - 1."""

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


def kernel_uid(kernel_id: str) -> int:
    """The uid (and gid) that the replicas of kernel `kernel_id` run as when the host agent
    runs as root: the same on every host, different for different kernels except for a hash
    collision (about 1 in 2 billion for a pair; the agent refuses to run two kernels of one
    uid side by side)."""
    digest = hashlib.sha256(kernel_id.encode()).digest()
    return KERNEL_UID_FIRST + int.from_bytes(digest[:8], "big") % KERNEL_UID_COUNT


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def mark_non_dumpable() -> bool:
    """Make this process non-dumpable (see the module docstring); True if it now is. Not
    Linux, or a libc without prctl: False, and nothing changes."""
    libc = _libc()
    if libc is None:
        return False
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return not is_dumpable()


def is_dumpable() -> bool:
    """Whether this process is dumpable (True where that cannot be asked: not Linux)."""
    libc = _libc()
    return libc is None or libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0


def unreachable(paths: Iterable[tuple[str | os.PathLike[str], str]]) -> list[str]:
    """What keeps a user with no rights of its own (neither owner nor group) from using each
    of `paths`: ``(path, need)`` pairs, `need` being ``"x"`` (a directory to traverse or a
    program to run) or ``"r"`` (a file or directory to read; directories are traversed too).

    Returns one sentence per problem naming the directory or file and its mode, such as
    ``"/root is mode 0700 (others cannot traverse it)"``; empty when everything is reachable.
    Symbolic links are resolved first. Only the mode bits are read (no ACLs)."""
    problems: dict[str, str] = {}
    for path, need in paths:
        target = Path(path).resolve()
        for directory in reversed(target.parents):
            _require(directory, stat.S_IXOTH, "traverse", problems)
        if need == "x" or target.is_dir():
            _require(target, stat.S_IXOTH, "traverse" if target.is_dir() else "run", problems)
        if need == "r":
            _require(target, stat.S_IROTH, "read", problems)
    return list(problems.values())


def not_writable_by(directory: str | os.PathLike[str], uid: int, gid: int) -> str | None:
    """Why user `uid`, of group `gid` and no other groups (a kernel's own user), could not
    create files in `directory`, as one sentence naming the folder in the way and its owner and
    mode; None when it can. It must traverse every folder above and write and traverse
    `directory` itself, by the mode bits of the class it falls in (owner, group or others).
    Links are resolved first; ACLs and read-only mounts are not looked at."""
    target = Path(directory).resolve()
    for folder, bits, verb in [
        *((parent, stat.S_IXOTH, "traverse") for parent in reversed(target.parents)),
        (target, stat.S_IWOTH | stat.S_IXOTH, "write in"),
    ]:
        try:
            found = folder.stat()
        except OSError as e:
            return f"{folder} cannot be examined ({e.strerror})"
        if not stat.S_ISDIR(found.st_mode):
            return f"{folder} is not a directory"
        mode = stat.S_IMODE(found.st_mode)
        if found.st_uid == uid:
            allowed = mode >> 6 & 0o7
        elif found.st_gid == gid:
            allowed = mode >> 3 & 0o7
        else:
            allowed = mode & 0o7
        if allowed & bits != bits:
            return f"{folder} is uid {found.st_uid}'s, mode {mode:04o} (uid {uid} cannot {verb} it)"
    return None


def _require(path: Path, bit: int, verb: str, problems: dict[str, str]) -> None:
    key = f"{path}:{verb}"
    if key in problems:
        return
    try:
        mode = path.stat().st_mode
    except OSError as e:
        problems[key] = f"{path} cannot be examined ({e.strerror})"
        return
    if not mode & bit:
        problems[key] = f"{path} is mode {stat.S_IMODE(mode):04o} (others cannot {verb} it)"
