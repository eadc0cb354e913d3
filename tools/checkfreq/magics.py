"""``%checkfreq``: iteration-level checkpoints of the notebook's training loop.

::

    %checkfreq on [--max-overhead 5] [--dir DIR]   hook the loop's optimizer.step; checkpoints
                                                   to DIR, overhead at most 5 % of training time
    %checkfreq off                                 unhook (the checkpoint in flight completes)
    %checkfreq [status]                            frequency, timings, overhead, last checkpoint
    %checkfreq resume [--dir DIR]                  the newest checkpoint back into the notebook's
                                                   objects; then checkfreq is on again, with the
                                                   settings saved with that checkpoint

A thin shell over `kernelfleet.tools.checkfreq.CheckFreq`: parse, call, show. The objects are
found in the notebook's namespace by name. DIR defaults to the kernel's folder in the fleet's
object store (``$KERNELFLEET_KERNEL_STORE/checkfreq``), which every replica of the kernel
reaches, so ``%checkfreq resume`` on another replica (after ``ReplicaLost`` or a migration) finds
it without having run ``%checkfreq on``. Bad arguments and `CheckpointError` raise
``UsageError``: one line. torch is imported at the first command, not when the kernel loads this.
"""

from __future__ import annotations

import argparse
import html
import os
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.kernels.magics.parsing import MagicParser, parse
from kernelfleet.protocol import ReplicaEnv

SUBFOLDER = "checkfreq"


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%checkfreq``."""
    magics = CheckFreqMagics(ipython)
    ipython.register_magics(magics)
    ipython.events.register("post_run_cell", magics.cell_ended)


def default_directory(env: dict[str, str] | None = None) -> tuple[Path, str]:
    """Where checkpoints go without ``--dir``, and a note for the user ("" in a fleet kernel)."""
    store = (os.environ if env is None else env).get(ReplicaEnv.KERNEL_STORE)
    if store:
        return Path(store) / SUBFOLDER, ""
    return Path.cwd() / SUBFOLDER, (
        "not in a fleet kernel: checkpoints go to ./checkfreq on this host only (--dir chooses)"
    )


def percent(text: str) -> float:
    """An argparse ``type``: a percentage above 0 and below 100, as a fraction."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError("expected a percentage above 0 and below 100")
    return value / 100


def checkfreq_parser() -> MagicParser:
    parser = MagicParser(
        prog="%checkfreq",
        description="Checkpoints of the training loop at iteration granularity, as often as "
        "an overhead bound allows (CheckFreq); resume after a lost replica.",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    on = commands.add_parser(
        "on",
        help="checkpoint the loop (hooks optimizer.step)",
        description="Hook every optimizer.step of the notebook's optimizer: the loop is "
        "profiled, then checkpointed every k steps, k chosen to keep the overhead bounded.",
    )
    on.add_argument("--max-overhead", type=percent, default=0.05, metavar="PERCENT",
                    help="training time it may take, in percent (default 5)")  # fmt: skip
    on.add_argument("--dir", help="the checkpoint folder (default: the kernel's object store)")
    commands.add_parser("off", help="stop checkpointing", description="Unhook the loop; the "
                        "checkpoint in flight completes.")  # fmt: skip
    commands.add_parser("status", help="frequency, timings, overhead, last checkpoint",
                        description="What checkfreq measured and decided.")  # fmt: skip
    resume = commands.add_parser(
        "resume",
        help="load the newest checkpoint and go on",
        description="Load the newest complete checkpoint into the notebook's objects of the "
        "same names (with the RNG states and the step), then checkpoint again with the "
        "settings saved with it. Run the training cell again: it goes on from that step.",
    )
    resume.add_argument("--dir", help="the checkpoint folder (default: the kernel's object store)")
    return parser


@magics_class
class CheckFreqMagics(Magics):
    """``%checkfreq``; `checkfreq` is the `CheckFreq` this kernel runs (None: off, or never on)."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.checkfreq: Any = None
        self._parser: MagicParser | None = None

    @property
    def parser(self) -> MagicParser:
        if self._parser is None:
            self._parser = checkfreq_parser()
        return self._parser

    @line_magic("checkfreq")
    def checkfreq_magic(self, line: str) -> Any:
        """Iteration-level checkpoints of the training loop (``%checkfreq --help``)."""
        args = parse(self.parser, line)
        if args is None:
            return None
        from kernelfleet.tools.checkfreq import CheckpointError

        try:
            if args.command == "on":
                return self._on(args.max_overhead, args.dir)
            if args.command == "off":
                return self._off()
            if args.command == "resume":
                return self._resume(args.dir)
            return StatusView(self.checkfreq.status() if self.checkfreq else None)
        except CheckpointError as e:
            raise UsageError(str(e)) from None

    def cell_ended(self, result: Any = None) -> None:
        """After every cell: a checkpoint started in the cell's last steps is committed now,
        and the time until the next training step is not counted."""
        if self.checkfreq is not None and self.checkfreq.status().enabled:
            self.checkfreq.pause()

    def _namespace(self) -> dict[str, Any]:
        return self.shell.user_ns if self.shell is not None else {}

    def _directory(self, given: str | None) -> Path:
        if given:
            return Path(given).expanduser()
        directory, note = default_directory()
        if note:
            print(note)
        return directory

    def _on(self, max_overhead: float, directory: str | None) -> None:
        from kernelfleet.tools.checkfreq import CheckFreq

        folder = self._directory(directory)
        self._stop()
        checkfreq = CheckFreq(folder, max_overhead=max_overhead, namespace=self._namespace())
        checkfreq.attach()
        self.checkfreq = checkfreq
        print(
            f"checkfreq is on: checkpoints to {folder}, at most {max_overhead:.1%} of training "
            f"time; the first {checkfreq.profile_steps} steps are profiled"
        )

    def _off(self) -> None:
        if self.checkfreq is None or not self.checkfreq.status().enabled:
            print("checkfreq is off")
            return
        self._stop()
        status = self.checkfreq.status()
        last = "none" if status.last_step is None else f"step {status.last_step}"
        print(f"checkfreq is off; the newest checkpoint: {last}, in {status.directory}")

    def _stop(self) -> None:
        if self.checkfreq is not None:
            self.checkfreq.detach()

    def _resume(self, directory: str | None) -> Any:
        from kernelfleet.tools.checkfreq import CheckFreq

        folder = self._directory(directory)
        settings = CheckFreq.saved_settings(folder)
        self._stop()
        checkfreq = CheckFreq(
            folder,
            max_overhead=float(settings.get("max_overhead", 0.05)),
            namespace=self._namespace(),
        )
        report = checkfreq.resume()
        checkfreq.attach()
        self.checkfreq = checkfreq
        return report


class StatusView:
    """``%checkfreq status``: a small table as HTML (``_repr_html_``) and as text (``__repr__``)."""

    def __init__(self, status: Any) -> None:
        self.status = status

    def rows(self) -> list[tuple[str, str]]:
        s = self.status
        if s is None:
            return [("state", "off (never on in this kernel; %checkfreq on starts it)")]
        every = "profiling" if s.frequency is None else f"every {s.frequency} steps"
        last = "none yet" if s.last_step is None else f"step {s.last_step}"
        rows = [
            ("state", "on" if s.enabled else "off"),
            ("folder", s.directory),
            ("step", str(s.step)),
            ("checkpoint", every + (" (one in flight)" if s.in_flight else "")),
            ("newest checkpoint", last),
            ("iteration", _seconds(s.iter_s)),
            ("snapshot", _seconds(s.snapshot_s)),
            ("persist", _seconds(s.persist_s)),
            ("overhead", f"{s.overhead:.1%} stalled (bound {s.max_overhead:.1%})"),
            ("slowdown", f"{s.slowdown:.1%} against steps with no checkpoint in flight"),
        ]
        if s.last_error:
            rows.append(("last error", s.last_error))
        return rows

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self.rows()
        )
        return (
            '<div class="kernelfleet-view"><p style="margin: 0.2em 0"><strong>checkfreq'
            f"</strong></p><table><tbody>{body}</tbody></table></div>"
        )

    def __repr__(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(["checkfreq", *(f"{k.ljust(width)}  {v}" for k, v in rows)])


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
