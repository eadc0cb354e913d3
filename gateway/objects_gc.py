"""Removing the object-store folders of kernels that are gone (the gateway's half of object GC).

Each kernel keeps its large values in a folder of its own under the shared object-store root
(``<root>/kernel-<id>``, see `kernelfleet.kernels.objectstore`). While the kernel lives, the
replica that leads its Raft group deletes the objects no live value points to
(`kernelfleet.kernels.replica.statesync_gc`). The folder itself is the gateway's to remove:

- **at once** when the kernel is shut down (the ``kernel-stopped`` event, published once its
  replicas were stopped): nothing can point to its objects any more;
- **after a grace period** when no kernel the gateway knows owns it: a kernel that died, or was
  shut down while no gateway ran. "Known" means running in this gateway or stored in its state
  file (``<state_dir>/kernels.json``), so a restarted gateway never removes the objects of the
  kernels it is adopting, even before it has re-linked them. A folder changed within the grace
  period (a kernel starting up creates its folder before the gateway may know it) stays; an
  unreadable state file stops the sweep altogether.

The gateway needs the right to remove the folders: they belong to each kernel's user (mode
0700) when the agents run kernels as users of their own, so the gateway must then run as root;
otherwise it logs, once per folder, that it cannot. The grace period is
``KERNELFLEET_OBJECTS_GRACE`` seconds (default 60), the same setting the replicas use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kernelfleet.gateway.event_schemas import EventType
from kernelfleet.gateway.events import EventBus
from kernelfleet.kernels.objectstore import grace_from_env, kernel_folder_name

log = logging.getLogger("kernelfleet.gateway.objects_gc")

FOLDER_PREFIX = "kernel-"


def stored_kernel_ids(state_file: Path) -> set[str] | None:
    """The ids in the gateway's state file; empty if there is none; None if it cannot be read
    (then nothing may be swept: it may hold kernels being adopted)."""
    try:
        stored = json.loads(state_file.read_text())
        return {str(kernel["id"]) for kernel in stored["kernels"]}
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def last_change(folder: Path) -> float:
    """The newest modification time of a kernel's folder and the folders in it (objects are
    added and removed there), not following links."""
    newest = os.lstat(folder).st_mtime
    for below in (folder / "objects", folder / "tmp"):
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(below).st_mtime)
            for shard in os.scandir(below):
                if shard.is_dir(follow_symlinks=False):
                    newest = max(newest, shard.stat(follow_symlinks=False).st_mtime)
    return newest


class KernelObjectsCollector:
    """Removes the folders of kernels that are gone under `root` (see the module docstring).

    `live_ids` returns the ids of the kernels this gateway runs now; `state_file` is its
    state file. Run `run` as a task on the gateway's loop; file work runs in a worker thread.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        live_ids: Callable[[], Iterable[str]],
        state_file: str | os.PathLike[str],
        events: EventBus,
        *,
        grace: float | None = None,
        interval: float | None = None,
    ) -> None:
        self.root = Path(root)
        self.live_ids = live_ids
        self.state_file = Path(state_file)
        self.events = events
        self.grace = grace_from_env() if grace is None else grace
        self.interval = interval or min(60.0, max(1.0, self.grace / 2))
        self.removed: list[str] = []
        self._refused: set[str] = set()

    async def run(self) -> None:
        """Remove a stopped kernel's folder at once, and sweep every `interval` seconds, until
        cancelled."""
        subscription = self.events.subscribe()
        sweeper = asyncio.ensure_future(self._sweep_every())
        try:
            async for event in subscription:
                if event["type"] == EventType.KERNEL_STOPPED.value and event["kernel_id"]:
                    await asyncio.to_thread(self.remove_kernel, event["kernel_id"])
        finally:
            subscription.close()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    async def _sweep_every(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.sweep)
            except Exception:
                log.exception("sweeping the object store failed")

    def remove_kernel(self, kernel_id: str) -> bool:
        """Remove the folder of `kernel_id` (shut down); True if it is gone now."""
        return self._remove(self.root / kernel_folder_name(kernel_id))

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove the folders no known kernel owns that did not change for `grace` seconds;
        return their names."""
        stored = stored_kernel_ids(self.state_file)
        if stored is None:
            log.warning("%s cannot be read: no object-store folder is removed", self.state_file)
            return []
        known = {kernel_folder_name(k) for k in (*self.live_ids(), *stored)}
        now = time.time() if now is None else now
        removed: list[str] = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return removed
        for entry in entries:
            if not entry.name.startswith(FOLDER_PREFIX) or entry.name in known:
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                if now - last_change(Path(entry.path)) < self.grace:
                    continue
            except OSError:
                continue
            if self._remove(Path(entry.path)):
                removed.append(entry.name)
        return removed

    def _remove(self, folder: Path) -> bool:
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            return True
        except OSError as e:
            if folder.name not in self._refused:
                self._refused.add(folder.name)
                log.warning(
                    "cannot remove the objects of a kernel that is gone, %s (%s): the gateway "
                    "must run as root to remove folders of kernels that run as users of their own",
                    folder,
                    e.strerror or e,
                )
            return False
        self.removed.append(folder.name)
        log.info("removed the object-store folder %s (its kernel is gone)", folder)
        return True
