"""The registry through which kernelfleet and each bundled tool add their magics.

A tool declares, in its ``pyproject.toml``::

    [project.entry-points."kernelfleet.magics"]
    ckpt = "kernelfleet.tools.checkpoint.magics:load"

where ``load(ipython) -> None`` registers its magics (``ipython.register_magics(...)``) and
returns. Its panel section goes in the ``kernelfleet.panel_sections`` group, which the JupyterLab
side reads; ``%fleet tools`` lists both groups.

`load_all` loads each entry point of ``kernelfleet.magics`` once per shell, in name order. An
entry point that fails to import or to load is reported on stderr in one line and recorded
(``%fleet tools`` shows why); the others load all the same. kernelfleet's own magics (`OWN`)
load even when the installed metadata lacks them (an editable install older than the code).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

MAGICS_GROUP = "kernelfleet.magics"
PANEL_SECTIONS_GROUP = "kernelfleet.panel_sections"

OWN: dict[str, str] = {
    "fleet": "kernelfleet.kernels.magics.fleet:load",
    "gpus": "kernelfleet.kernels.magics.gpus:load",
    "pipeline": "kernelfleet.tools.pipeline.magics:load",
    "schedule": "kernelfleet.kernels.magics.schedule:load",
    "checkfreq": "kernelfleet.tools.checkfreq.magics:load",
    "energy": "kernelfleet.tools.energy.magics:load",
    "dataload": "kernelfleet.tools.dataload.magics:load",
    "pufferfish": "kernelfleet.tools.pufferfish.magics:load",
}
"""kernelfleet's own entry points of `MAGICS_GROUP`, as pyproject.toml declares them."""


@dataclass(frozen=True)
class Tool:
    """One entry point of `MAGICS_GROUP` or `PANEL_SECTIONS_GROUP`, as ``%fleet tools`` shows
    it. ``status`` is ``"loaded"`` or ``"failed: <why>"`` for a magic this shell loaded (or
    tried), ``"not loaded"`` for one it did not, and ``""`` for a panel section."""

    group: str
    name: str
    value: str
    provider: str
    status: str = ""


_loaded: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], str]] = weakref.WeakKeyDictionary()
"""shell -> (entry point name, value) -> its status: what `load_all` did in each shell."""


def magic_entry_points() -> list[EntryPoint]:
    """The entry points of `MAGICS_GROUP`, kernelfleet's own included, by name."""
    found = {(ep.name, ep.value): ep for ep in entry_points(group=MAGICS_GROUP)}
    for name, value in OWN.items():
        found.setdefault((name, value), EntryPoint(name, value, MAGICS_GROUP))
    return sorted(found.values(), key=lambda ep: (ep.name, ep.value))


def load_all(shell: Any) -> dict[tuple[str, str], str]:
    """Load into `shell` every entry point of `MAGICS_GROUP` it has not loaded yet: import
    each, call it with `shell`. One that raises is reported on stderr, in one line, and does not
    stop the others. Returns (name, value) -> ``"loaded"`` or ``"failed: <why>"``, for every
    entry point this shell saw, this call and earlier ones."""
    done = _loaded.setdefault(shell, {})
    for ep in magic_entry_points():
        key = (ep.name, ep.value)
        if key in done:
            continue
        try:
            ep.load()(shell)
        except Exception as e:
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            done[key] = f"failed: {why}"
            print(
                f"kernelfleet: the magic {ep.name!r} ({ep.value}) did not load: {why}",
                file=sys.stderr,
            )
            continue
        done[key] = "loaded"
    return dict(done)


def installed(shell: Any = None) -> list[Tool]:
    """What is installed in both groups, magics first, each with its status in `shell`."""
    done = _loaded.get(shell, {}) if shell is not None else {}
    tools = [
        Tool(MAGICS_GROUP, ep.name, ep.value, _provider(ep), done.get((ep.name, ep.value), ""))
        for ep in magic_entry_points()
    ]
    if shell is not None:
        tools = [t if t.status else _with_status(t, "not loaded") for t in tools]
    sections = sorted(entry_points(group=PANEL_SECTIONS_GROUP), key=lambda ep: ep.name)
    tools += [Tool(PANEL_SECTIONS_GROUP, ep.name, ep.value, _provider(ep)) for ep in sections]
    return tools


def _with_status(tool: Tool, status: str) -> Tool:
    return Tool(tool.group, tool.name, tool.value, tool.provider, status)


def _provider(ep: EntryPoint) -> str:
    """The distribution that declares `ep`, with its version ("kernelfleet" for `OWN` ones
    the metadata lacks)."""
    dist = ep.dist
    if dist is None:
        return "kernelfleet"
    return f"{dist.metadata['Name']} {dist.version}"
