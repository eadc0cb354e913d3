"""``%pipeline``: profile a model and plan its pipeline stages, from a notebook.

::

    %pipeline profile MODEL SAMPLE [--repeats N] [--warmup N]
                                  layer by layer, on the notebook's MODEL and SAMPLE batch
    %pipeline profile --graph PATH   a PipeDream graph.txt profile instead
    %pipeline plan --workers N --bandwidth BYTES_PER_S [--memory BYTES] [--profile NAME]
    %pipeline plan --levels 4:1e10,2:1.25e9 [--profile NAME]

A thin shell over `profiler`, `graphfile`, `planner` and `hierarchy`: parse, call, show. Each
returns a report whose text is the table (and, for a plan, the diagram); its ``.profile`` or
``.plan`` is the object itself. ``plan`` uses the last profile, or ``--profile NAME``: a notebook
variable holding a profile (or a report of one), or a ``graph.txt`` path. Bad arguments, and what
the planner refuses (a layer over the memory limit), raise ``UsageError`` in one line.
"""

from __future__ import annotations

import argparse
import html
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.profiles import ModelProfile


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%pipeline``."""
    ipython.register_magics(PipelineMagics)


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises ``UsageError`` instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _HelpShown if status == 0 else UsageError((message or "").strip())


class _HelpShown(Exception):
    pass


def pipeline_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="%pipeline",
        description="Profile a model layer by layer and plan pipeline stages (PipeDream).",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    profile = commands.add_parser("profile", help="measure a model, or read a graph.txt")
    profile.add_argument("model", nargs="?", help="a notebook variable: a Sequential-like model")
    profile.add_argument("sample", nargs="?", help="a notebook variable: one sample batch")
    profile.add_argument("--graph", metavar="PATH", help="read PipeDream's graph.txt instead")
    profile.add_argument("--repeats", type=_count, default=3, help="measured passes (3)")
    profile.add_argument("--warmup", type=_count_or_zero, default=1, help="unmeasured passes (1)")
    plan = commands.add_parser("plan", help="split the profiled model into stages")
    plan.add_argument("--workers", type=_count, help="number of workers (GPUs)")
    plan.add_argument("--bandwidth", type=float, help="bytes per second between workers")
    plan.add_argument("--memory", type=float, help="bytes one worker may hold (no limit)")
    plan.add_argument("--levels", help="COUNT:BYTES_PER_S,... innermost first (hierarchical)")
    plan.add_argument("--profile", metavar="NAME", help="a profile variable or a graph.txt path")
    return parser


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("expected a whole number from 1")
    return int(text)


def _count_or_zero(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError("expected a whole number from 0")
    return int(text)


@dataclass(frozen=True)
class Report:
    """What a ``%pipeline`` command shows: ``text`` (also as HTML) and the object behind it."""

    text: str
    profile: ModelProfile
    plan: Any = None

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"


def profile_table(profile: ModelProfile) -> str:
    """One line per layer: forward and backward ms, output and parameter MB."""
    header = f"{'layer':>5}  {'fwd ms':>9}{'bwd ms':>9}{'out MB':>10}{'param MB':>10}  layer"
    lines = [header, "-" * len(header)]
    for index, layer in enumerate(profile.layers):
        lines.append(
            f"{index:>5}  {layer.forward_s * 1e3:>9.3f}{layer.backward_s * 1e3:>9.3f}"
            f"{layer.activation_bytes / 1e6:>10.3f}{layer.parameter_bytes / 1e6:>10.3f}  "
            f"{layer.description[:60]}"
        )
    total = profile.total
    lines.append(
        f"{len(profile)} layers: {total.compute_s * 1e3:.3f} ms forward and backward, "
        f"{total.parameter_bytes / 1e6:.3f} MB of parameters"
    )
    return "\n".join(lines)


@magics_class
class PipelineMagics(Magics):
    """``%pipeline``: see the module docstring."""

    last_profile: ModelProfile | None = None

    @line_magic
    def pipeline(self, line: str) -> Report | None:
        parser = pipeline_parser()
        try:
            args = parser.parse_args(shlex.split(line, comments=True))
        except _HelpShown:
            return None
        except ValueError as error:  # shlex: an unclosed quote
            raise UsageError(f"{error}\n{parser.format_usage().rstrip()}") from None
        try:
            if args.command == "profile":
                return self._profile(args)
            return self._plan(args)
        except InvalidRequest as error:
            raise UsageError(error.message) from None

    def _profile(self, args: argparse.Namespace) -> Report:
        if args.graph:
            if args.model or args.sample:
                raise UsageError("give MODEL SAMPLE or --graph PATH, not both")
            from kernelfleet.tools.pipeline.graphfile import read_graph_profile

            profile = read_graph_profile(args.graph)
        else:
            if not args.model or not args.sample:
                raise UsageError("give the notebook's MODEL and SAMPLE batch, or --graph PATH")
            from kernelfleet.tools.pipeline.profiler import profile_model

            model, sample = self._variable(args.model), self._variable(args.sample)
            profile = profile_model(model, sample, repeats=args.repeats, warmup=args.warmup)
        self.last_profile = profile
        return Report(profile_table(profile), profile)

    def _plan(self, args: argparse.Namespace) -> Report:
        from kernelfleet.tools.pipeline.render import plan_diagram, plan_table

        profile = self._chosen_profile(args.profile)
        if args.levels:
            if args.workers or args.bandwidth or args.memory:
                raise UsageError("give --levels alone, or --workers and --bandwidth")
            from kernelfleet.tools.pipeline.hierarchy import parse_levels, plan_hierarchical

            plan = plan_hierarchical(profile, parse_levels(args.levels))
        else:
            if args.workers is None or args.bandwidth is None:
                raise UsageError("give --workers N and --bandwidth BYTES_PER_S (or --levels)")
            from kernelfleet.tools.pipeline.planner import plan_pipeline

            plan = plan_pipeline(profile, args.workers, args.bandwidth, memory_bytes=args.memory)
        text = f"{plan_table(plan, profile)}\n\n{plan_diagram(plan)}"
        return Report(text, profile, plan)

    def _chosen_profile(self, name: str | None) -> ModelProfile:
        if name is None:
            if self.last_profile is None:
                raise UsageError("profile a model first: %pipeline profile MODEL SAMPLE")
            return self.last_profile
        value = self.shell.user_ns.get(name) if self.shell is not None else None
        if isinstance(value, Report):
            return value.profile
        if isinstance(value, ModelProfile):
            return value
        if value is None and Path(name).is_file():
            from kernelfleet.tools.pipeline.graphfile import read_graph_profile

            return read_graph_profile(name)
        raise UsageError(f"--profile {name}: neither a profile in the notebook nor a file")

    def _variable(self, name: str) -> Any:
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name not in namespace:
            raise UsageError(f"{name} is not defined in the notebook")
        return namespace[name]
