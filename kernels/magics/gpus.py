"""``%%gpus N`` (run this cell with N GPUs) and ``%gpus [N]`` (this kernel's GPUs per cell).

The gateway places a cell before the kernel sees its code: it reads a leading ``%%gpus N`` line
itself (`kernelfleet.protocol.gpus_magic`) and binds N GPUs for the cell, or fails it at once
for a bad N. So the cell magic only checks N with the same parser, runs the body
(``shell.run_cell``), then says which devices the cell got (``KERNELFLEET_GPUS``):
``ran on 1 GPU: 0``, or that it got fewer than asked, and why when it can tell (a kernel not
run by kernelfleet). A body that fails fails the cell, its traceback shown once.

``%gpus N`` sets the kernel's default for later cells through the gateway; ``%gpus`` shows it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from kernelfleet.errors import InvalidRequest
from kernelfleet.protocol import GPUS_MAGIC_USAGE, ReplicaEnv, gpus_magic

HELP = f"""{GPUS_MAGIC_USAGE}
       %gpus N   (this kernel's cells get N GPUs each from now on)
       %gpus     (show how many GPUs this kernel's cells get)

%%gpus N on a cell's first line runs that cell with N GPUs: the kernelfleet gateway reads the
line before it places the cell, binds N GPUs for it (0: none), and refuses a bad N or more GPUs
than any host has before the cell runs. After the cell, the magic says which devices it got.
%gpus N sets this kernel's default for later cells (a cell's %%gpus still wins)."""


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%gpus`` and ``%%gpus``."""
    ipython.register_magics(GpusMagics)


def parse_count(line: str, magic: str, usage: str) -> int | None:
    """N from the arguments of `magic` (``%gpus`` or ``%%gpus``) as `gpus_magic` reads them;
    None for ``--help``. Raises ``UsageError`` with `usage` for a bad N."""
    try:
        return gpus_magic(f"%%gpus {line}")
    except InvalidRequest as e:
        first = e.message.splitlines()[0].replace("%%gpus", magic, 1)
        raise UsageError(f"{first}\n{usage}") from None


def devices_report(asked: int, environ: dict[str, str] | os._Environ[str]) -> str:
    """What a ``%%gpus`` cell says after it ran: the devices it got against the `asked`."""
    got = [d for d in environ.get(ReplicaEnv.GPUS.value, "").split(",") if d.strip()]
    listed = ", ".join(got)
    if asked == 0 and not got:
        return "ran without GPUs"
    if len(got) == asked:
        return f"ran on {_gpus(asked)}: {listed}"
    if len(got) > asked:
        return f"ran on {_gpus(len(got))}: {listed} (asked for {asked})"
    why = ""
    if not environ.get(ReplicaEnv.KERNEL_ID.value):
        why = ": this kernel is not run by kernelfleet"
    return f"asked for {_gpus(asked)}, got {len(got) or 'none'}{': ' + listed if got else ''}{why}"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


@magics_class
class GpusMagics(Magics):
    """``%gpus`` and ``%%gpus``; `client_factory` as for ``%fleet``."""

    def __init__(self, shell: Any = None, client_factory: Callable[[], Any] | None = None):
        super().__init__(shell)
        self.client_factory = client_factory

    def client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory()
        from kernelfleet.client import FleetClient

        return FleetClient.from_environment()

    @line_cell_magic
    def gpus(self, line: str, cell: str | None = None) -> None:
        """Run this cell with N GPUs (``%%gpus N``), or set (``%gpus N``) or show (``%gpus``)
        this kernel's GPUs per cell. ``%gpus --help`` says more."""
        if cell is None:
            self._line(line)
            return
        asked = parse_count(line, "%%gpus", GPUS_MAGIC_USAGE)
        if asked is None:
            print(HELP)
            return
        assert self.shell is not None, "IPython registers magics with their shell"
        result = self.shell.run_cell(cell, store_history=False)
        print(devices_report(asked, os.environ))
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            _fail_quietly(error)

    def _line(self, line: str) -> None:
        usage = "usage: %gpus [N]  (N: this kernel's GPUs per cell, 0 or more)"
        if not line.strip():
            model = self.client().kernel()
            count = model.get("gpus")
            if not isinstance(count, int):
                print("the gateway does not say how many GPUs this kernel's cells get")
                return
            print(f"this kernel's cells get {_gpus(count)} each (change: %gpus N)")
            return
        count = parse_count(line, "%gpus", usage)
        if count is None:
            print(HELP)
            return
        self.client().set_gpus(count)
        print(f"this kernel's cells get {_gpus(count)} each from now on (one cell: %%gpus N)")


def _fail_quietly(error: BaseException) -> None:
    """Fail the ``%%gpus`` cell with the body's own error, whose traceback the body's run
    already showed: IPython renders it again as one line (``_render_traceback_``)."""
    line = f"{type(error).__name__}: {error}".splitlines()[0]
    # an exception without a __dict__ refuses the attribute: then it shows twice, and still fails
    with contextlib.suppress(AttributeError):
        error._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]
    raise error
