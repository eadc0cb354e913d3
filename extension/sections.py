"""Panel sections from other tools: the entry-point group ``kernelfleet.panel_sections``.

A tool adds a section to the JupyterLab fleet panel without touching the panel's code: it
subclasses `PanelSection` and names the class in its package's entry points::

    [project.entry-points."kernelfleet.panel_sections"]
    checkpoints = "mytool.panel:CheckpointSection"

The server extension loads each class once (at the first request), instantiates it without
arguments, and on ``GET /kernelfleet/api/sections?kernel=ID`` awaits `PanelSection.render` for
each, in entry-point name order. The browser renders what comes back generically: a title, rows of
label and value, and an optional line of text. A section that raises is shown with its error
instead of its rows (and logged); the others are unaffected.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

GROUP = "kernelfleet.panel_sections"
log = logging.getLogger("kernelfleet.extension.sections")


@dataclass(frozen=True)
class SectionContext:
    """What a section may show: the notebook's kernel as the gateway models it (``None`` when
    the panel shows no kernelfleet kernel) and the fleet summary (``GET /api/fleet``)."""

    kernel_id: str | None
    kernel: dict[str, Any] | None
    fleet: dict[str, Any]


@dataclass(frozen=True)
class Section:
    """One rendered section: simple data the panel shows as it is."""

    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    text: str | None = None

    def model(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "rows": [{"label": label, "value": value} for label, value in self.rows],
            "text": self.text,
        }


class PanelSection(ABC):
    """A section of the fleet panel, contributed by a tool.

    `render` is called on the server, once per panel refresh (when the panel opens, when its
    notebook's kernel changes, and on that kernel's cell and replica events), so it must be quick:
    no blocking I/O (await what it needs). It returns ``None`` to show nothing for this context
    (say, a checkpoint tool for a kernel that has no checkpoints).
    """

    title: str = ""
    """Shown when `render` raises, to name the section that failed."""

    @abstractmethod
    async def render(self, context: SectionContext) -> Section | None:
        """This section for `context`, or ``None`` to leave it out."""


def load_sections() -> list[tuple[str, PanelSection]]:
    """Every installed section, by entry-point name; a class that fails to load is logged and
    left out."""
    loaded: list[tuple[str, PanelSection]] = []
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            cls = point.load()
            if not (isinstance(cls, type) and issubclass(cls, PanelSection)):
                raise TypeError(f"{point.value} is not a PanelSection subclass")
            loaded.append((point.name, cls()))
        except Exception:
            log.exception("kernelfleet: panel section %r could not be loaded", point.name)
    return loaded


async def render_all(
    sections: list[tuple[str, PanelSection]], context: SectionContext
) -> list[dict[str, Any]]:
    """Each section's model, with its entry-point ``name``; a failing one as ``error``."""
    models: list[dict[str, Any]] = []
    for name, section in sections:
        try:
            rendered = await section.render(context)
        except Exception as error:
            log.exception("kernelfleet: panel section %r failed", name)
            title = section.title or name
            models.append({"name": name, "title": title, "rows": [], "text": None,
                           "error": f"{type(error).__name__}: {error}"})  # fmt: skip
            continue
        if rendered is not None:
            models.append({"name": name, **rendered.model(), "error": None})
    return models
