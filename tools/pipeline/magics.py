"""``%pipeline``: profile a model and plan its pipeline stages, from a notebook.

::

    %pipeline profile MODEL SAMPLE [--repeats N] [--warmup N]
                                  layer by layer, on the notebook's MODEL and SAMPLE batch
    %pipeline profile --graph PATH   a PipeDream graph.txt profile instead
    %pipeline plan --workers N --bandwidth BYTES_PER_S [--memory BYTES] [--profile NAME]
    %pipeline plan --levels 4:1e10,2:1.25e9 [--profile NAME]
    %pipeline run MODEL INPUTS TARGETS --loss mse|cross_entropy|NAME
                  --schedule gpipe|1f1b|interleaved --microbatches M
                  [--steps S] [--lr LR] [--workers N] [--plan NAME | --stages 0-2x2,3-4]
                  [--no-replicas]

A thin shell over `profiler`, `graphfile`, `planner`, `hierarchy` and `runner`: parse, call,
show. Each returns a report whose text is the table (and, for a plan, the diagram); its
``.profile``, ``.plan`` or ``.run`` is the object itself. ``plan`` uses the last profile, or
``--profile NAME``: a notebook variable holding a profile (or a report of one), or a
``graph.txt`` path. ``run`` trains the notebook's MODEL on the batch INPUTS/TARGETS with the
last plan's stages (or ``--plan NAME``, a plan or a report of one, or ``--stages``) on worker
processes, one per replica of each stage (``--no-replicas``: one per stage), and leaves the
trained weights in MODEL (docs/pipeline.md, "Running a plan"). Bad
arguments, what the planner refuses (a layer over the memory limit) and a run that cannot be
laid out raise ``UsageError`` in one line; a worker's failure raises `WorkerFailed` with its
error.
"""

from __future__ import annotations

import argparse
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.magics.parsing import MagicParser, parse
from kernelfleet.tools.pipeline.profiles import ModelProfile
from kernelfleet.tools.pipeline.schedules import SCHEDULES


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%pipeline``."""
    ipython.register_magics(PipelineMagics)


def pipeline_parser() -> MagicParser:
    from kernelfleet.tools.pipeline.runner import HOSTS

    parser = MagicParser(
        prog="%pipeline",
        description="Profile a model layer by layer, plan pipeline stages (PipeDream), run them.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=MagicParser)
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
    run = commands.add_parser("run", help="train the model with the plan's stages on workers")
    run.add_argument("model", help="a notebook variable: the Sequential-like model to train")
    run.add_argument("inputs", help="a notebook variable: the batch of inputs")
    run.add_argument("targets", help="a notebook variable: the batch of targets")
    run.add_argument(
        "--loss", required=True, help="mse, cross_entropy, or a notebook function (out, target)"
    )
    run.add_argument("--schedule", required=True, choices=list(SCHEDULES), help="pipeline schedule")
    run.add_argument("--microbatches", type=_count, required=True, help="per step")
    run.add_argument("--steps", type=_count, default=1, help="SGD steps on the batch (1)")
    run.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (0.01)")
    run.add_argument(
        "--workers", type=_count, help="processes (one per stage; interleaved: stages / 2)"
    )
    stages = run.add_mutually_exclusive_group()
    stages.add_argument("--plan", metavar="NAME", help="a plan variable (the last plan)")
    stages.add_argument(
        "--stages", metavar="0-2x2,3-4", help="stage ranges (xR: R replicas) instead of a plan"
    )
    run.add_argument(
        "--no-replicas",
        action="store_true",
        help="run each stage once, on one worker, whatever its replicas",
    )
    run.add_argument(
        "--hosts",
        choices=list(HOSTS),
        default="auto",
        help="where workers the cell's GPUs do not cover run: auto (other hosts of the fleet "
        "when the cell holds some GPUs), local (this host), fleet (always other hosts)",
    )
    run.add_argument("--timeout", type=float, default=120.0, help="seconds of silence (120)")
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
    profile: ModelProfile | None
    plan: Any = None
    run: Any = None

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


def run_table(result: Any) -> str:
    """A run's layout (stage, layers, replicas, workers), its loss per step and its
    throughput."""
    from kernelfleet.tools.pipeline.runner import visible_gpus

    gpus = visible_gpus()
    where = f"GPUs {','.join(gpus[: result.ranks])}, nccl" if gpus else "CPU, gloo"
    size = result.batch_size // result.microbatches
    lines = [f"note: {note}" for note in result.notes]
    lines.append(
        f"{result.schedule} on {result.ranks} workers ({where}): {result.microbatches} "
        f"microbatches of {size} samples, {len(result.losses)} steps"
    )
    placement = result.ranks_of_stages
    if any(len(ranks) > 1 for ranks in placement):
        lines.append("the replicas of each stage sum their gradients before every SGD step")
    lines.append(f"{'stage':>5}  {'layers':<9}{'replicas':>8}  workers")
    for index, ((first, last), ranks) in enumerate(zip(result.ranges, placement, strict=True)):
        layers, workers = f"{first}-{last}", ",".join(map(str, ranks))
        lines.append(f"{index:>5}  {layers:<9}{len(ranks):>8}  {workers}")
    lines.append(f"{'step':>5}  {'loss':>12}{'seconds':>10}")
    for step, (loss, seconds) in enumerate(zip(result.losses, result.step_seconds, strict=True)):
        lines.append(f"{step + 1:>5}  {loss:>12.6g}{seconds:>10.4f}")
    steady = "after the first step" if len(result.step_seconds) > 1 else "one step"
    lines.append(
        f"{result.samples_per_s:.1f} samples/s ({steady}); the model holds the trained weights"
    )
    return "\n".join(lines)


@magics_class
class PipelineMagics(Magics):
    """``%pipeline``: see the module docstring."""

    last_profile: ModelProfile | None = None
    last_plan: Any = None

    @line_magic
    def pipeline(self, line: str) -> Report | None:
        args = parse(pipeline_parser(), line)
        if args is None:
            return None
        try:
            if args.command == "profile":
                return self._profile(args)
            if args.command == "plan":
                return self._plan(args)
            return self._run(args)
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
        self.last_plan = plan
        return Report(text, profile, plan)

    def _run(self, args: argparse.Namespace) -> Report:
        from kernelfleet.tools.pipeline.runner import WorkerFailed, run_pipeline
        from kernelfleet.tools.pipeline.stages import parse_stages, stage_ranges, without_replicas

        if args.stages:
            split = parse_stages(args.stages)
        else:
            split = stage_ranges(self._chosen_plan(args.plan))
        if args.no_replicas:
            split = without_replicas(split)
        model, inputs, targets = (
            self._variable(n) for n in (args.model, args.inputs, args.targets)
        )
        try:
            result = run_pipeline(
                model,
                split.ranges,
                inputs,
                targets,
                loss=self._loss(args.loss),
                schedule=args.schedule,
                microbatches=args.microbatches,
                steps=args.steps,
                lr=args.lr,
                ranks=args.workers,
                timeout_s=args.timeout,
                notes=split.notes,
                replicas=split.replicas,
                hosts=args.hosts,
            )
        except WorkerFailed as error:
            raise WorkerFailed(error.message) from None  # not the driver's stack
        return Report(run_table(result), None, run=result)

    def _chosen_plan(self, name: str | None) -> Any:
        from kernelfleet.tools.pipeline.planner import Plan

        if name is None:
            if self.last_plan is None:
                raise UsageError("plan first (%pipeline plan ...), or give --plan or --stages")
            return self.last_plan
        value = self._variable(name)
        plan = value.plan if isinstance(value, Report) else value
        if not isinstance(plan, Plan):
            raise UsageError(f"--plan {name}: not a plan (a %pipeline plan report or its .plan)")
        return plan

    def _loss(self, name: str) -> Any:
        import torch

        named = {
            "mse": torch.nn.functional.mse_loss,
            "cross_entropy": torch.nn.functional.cross_entropy,
        }
        if name in named:
            return named[name]
        loss = self._variable(name)
        if not callable(loss):
            raise UsageError(f"--loss {name}: not mse, cross_entropy or a function of the notebook")
        return loss

    def _chosen_profile(self, name: str | None) -> ModelProfile:
        if name is None:
            if self.last_profile is None:
                raise UsageError("profile a model first: %pipeline profile MODEL SAMPLE")
            return self.last_profile
        value = self.shell.user_ns.get(name) if self.shell is not None else None
        if isinstance(value, Report) and value.profile is not None:
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
