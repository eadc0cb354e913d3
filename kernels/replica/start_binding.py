"""A pooled replica taking on the kernel start that took its group (`Request.BIND`).

A pooled group is launched before any start asks for it, under the kernel id (and so the user,
token and Raft password) it keeps for life. What only the start knows is bound afterwards: its
``KERNEL_*`` variables and its working directory. The working directory follows the host
agent's rule for a cold start (`kernelfleet.kernels.agent.replicas`): the folder asked for if it
is a directory the kernel's user may create files in, else the replica's private ``work/``
folder when it has one (a kernel of its own user), else the folder asked for all the same (a
kernel of the agent's user starts there), and where it is not a directory here, where the
replica already runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

log = logging.getLogger("kernelfleet.replica")

BOUND_PREFIX = "KERNEL_"
"""The only variables a bind may set: informational ones, which nothing reads at process start
(``PYTHONPATH`` and the like must be set at launch, so such a start is never served from the
pool)."""


class BindRefused(ValueError):
    """A bind request that cannot be applied; the message names the field and value."""


def check_env(env: object) -> dict[str, str]:
    """`env` as a bind may apply it; `BindRefused` naming the first bad name or value."""
    if not isinstance(env, Mapping):
        raise BindRefused(f"'env' must map names to strings, not {type(env).__name__}")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name.startswith(BOUND_PREFIX):
            raise BindRefused(f"'env' may set only {BOUND_PREFIX}* variables, not {name!r}")
        if not isinstance(value, str) or "\0" in value or "\0" in name:
            raise BindRefused(f"'env' {name!r} must be a string without NUL, not {value!r}")
        checked[name] = value
    return checked


def bind_start(
    env: object,
    working_dir: object,
    replica_dir: Path,
    environ: MutableMapping[str, str] | None = None,
) -> Path:
    """Apply a start's `env` (to `environ`, this process's by default) and `working_dir`
    (see the module docstring); return the directory the kernel runs in now. `BindRefused`
    before anything changes if either is malformed."""
    checked = check_env(env)
    if not isinstance(working_dir, str) or "\0" in working_dir:
        raise BindRefused(f"'working_dir' must be a string (a path), not {working_dir!r}")
    (os.environ if environ is None else environ).update(checked)
    target = _working_dir(working_dir, replica_dir)
    if target is not None:
        os.chdir(target)
    return Path.cwd()


def _working_dir(wanted: str, replica_dir: Path) -> Path | None:
    """Where to run for `wanted`; None: stay."""
    if not wanted:
        return None
    folder = Path(wanted)
    if not folder.is_dir():
        log.info("KERNEL_WORKING_DIR %r is not a directory here: staying in %s", wanted, Path.cwd())
        return None
    if os.access(folder, os.W_OK | os.X_OK):
        return folder
    work = replica_dir / "work"
    if work.is_dir() and work.stat().st_uid == os.getuid():
        log.warning(
            "the kernel starts in %s, not in %s: uid %d cannot create files there",
            work, folder, os.getuid(),
        )  # fmt: skip
        return work
    return folder if os.access(folder, os.X_OK) else None
