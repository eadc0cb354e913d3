"""The pufferfish tool's errors: each is shown by IPython as one line, ``Name: message``."""

from __future__ import annotations

from kernelfleet.errors import FleetError


class PufferfishError(FleetError):
    """Base of the pufferfish tool's errors."""

    reason = "pufferfish-error"

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self.message}"]


class NothingToFactorize(PufferfishError):
    """The model has no layer to factorise, or every one stays full rank (the message says
    why for each)."""

    reason = "nothing-to-factorize"
