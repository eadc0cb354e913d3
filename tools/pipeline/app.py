"""``kernelfleet pipeline-plan``: PipeDream's partitioner over a ``graph.txt`` profile.

    kernelfleet pipeline-plan --profile graph.txt --workers N --bandwidth BYTES_PER_S \
        [--memory BYTES] [--activation-compression RATIO] [--json OUT]
    kernelfleet pipeline-plan --profile graph.txt --levels GPUS:BYTES_PER_S,MACHINES:BYTES_PER_S \
        [--json OUT]

``--levels`` plans over machines of several GPUs (PipeDream's hierarchical levels, innermost
first), in place of ``--workers`` and ``--bandwidth``.

Prints the plan as a table and a small diagram. ``--json`` writes exactly
``{"stages": [{"layers": [first, last], "replicas": r}, ...], "time_per_minibatch_s",
"speedup_vs_data_parallel", "speedup_vs_one_worker"}`` instead, layers numbered (inclusively) in
PipeDream's profile order; tools outside the project read it, so it stays as it is
(docs/pipeline.md). Bad input ends with a one-line error and exit code 2.
"""

from __future__ import annotations

import json
import math
import sys
from argparse import ArgumentError
from pathlib import Path

from traitlets import Float, Int, TraitError, Unicode
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.graphfile import read_graph_profile
from kernelfleet.tools.pipeline.hierarchy import parse_levels, plan_hierarchical
from kernelfleet.tools.pipeline.planner import Plan, plan_pipeline
from kernelfleet.tools.pipeline.profiles import ModelProfile
from kernelfleet.tools.pipeline.render import plan_diagram, plan_table


class PipelinePlanApp(Application):
    """Plans pipeline stages for a profiled model, as PipeDream's optimizer does."""

    name = "kernelfleet-pipeline-plan"
    version = __version__
    description = "Split a profiled model into replicated pipeline stages (PipeDream's planner)."
    aliases = {
        "profile": "PipelinePlanApp.profile",
        "workers": "PipelinePlanApp.workers",
        "bandwidth": "PipelinePlanApp.bandwidth",
        "memory": "PipelinePlanApp.memory",
        "activation-compression": "PipelinePlanApp.activation_compression",
        "levels": "PipelinePlanApp.levels",
        "json": "PipelinePlanApp.json_path",
    }

    profile = Unicode("", config=True, help="PipeDream's graph.txt profile of the model.")
    workers = Int(0, config=True, help="Number of workers (GPUs) to plan for.")
    bandwidth = Float(0.0, config=True, help="Bandwidth between workers, bytes per second.")
    memory = Float(
        0.0, config=True, help="Memory of one worker in bytes; 0: no limit (PipeDream's default)."
    )
    activation_compression = Float(
        0.0,
        config=True,
        help="Count activation transfers, compressed by this ratio (PipeDream's "
        "--activation_compression_ratio); 0: not counted (PipeDream's default).",
    )
    levels = Unicode(
        "",
        config=True,
        help="Hierarchical levels, innermost first: COUNT:BYTES_PER_S pairs joined by commas "
        "(4:1e10,2:1.25e9 is 2 machines of 4 GPUs); replaces --workers and --bandwidth.",
    )
    json_path = Unicode("", config=True, help="Write the plan as JSON to this file.")

    def _flat(self) -> tuple[ModelProfile, Plan]:
        if self.workers < 1:
            raise InvalidRequest(f"give --workers N, a whole number >= 1 (got {self.workers})")
        if not self.bandwidth > 0 or math.isinf(self.bandwidth):
            raise InvalidRequest(
                f"give --bandwidth BYTES_PER_S, a positive number (got {self.bandwidth:g})"
            )
        if self.memory < 0 or self.activation_compression < 0:
            raise InvalidRequest("--memory and --activation-compression cannot be negative")
        profile = read_graph_profile(self.profile)
        plan = plan_pipeline(
            profile,
            self.workers,
            self.bandwidth,
            memory_bytes=self.memory or None,
            activation_compression=self.activation_compression or None,
        )
        return profile, plan

    def _hierarchical(self) -> tuple[ModelProfile, Plan]:
        if self.workers or self.bandwidth:
            raise InvalidRequest("give either --levels or --workers and --bandwidth, not both")
        if self.memory or self.activation_compression:
            raise InvalidRequest(
                "--memory and --activation-compression are not modelled with --levels"
            )
        levels = parse_levels(self.levels)
        profile = read_graph_profile(self.profile)
        return profile, plan_hierarchical(profile, levels)

    def parse_command_line(self, argv: list[str] | None = None) -> None:
        """As `Application`'s, but a bad value ends with one line and exit code 2, not 1."""
        parse = Application.parse_command_line.__wrapped__  # type: ignore[attr-defined]
        try:
            parse(self, argv)
        except (TraitError, ArgumentError) as error:
            print(f"kernelfleet pipeline-plan: {error}", file=sys.stderr)
            self.exit(2)

    def start(self) -> None:
        try:
            self._run()
        except InvalidRequest as error:
            print(f"kernelfleet pipeline-plan: {error.message}", file=sys.stderr)
            self.exit(2)

    def _run(self) -> None:
        if not self.profile:
            raise InvalidRequest("give the model's profile: --profile graph.txt")
        if self.levels:
            profile, plan = self._hierarchical()
        else:
            profile, plan = self._flat()
        if self.json_path:
            document = json.dumps(plan.as_document(), indent=2) + "\n"
            try:
                Path(self.json_path).write_text(document, encoding="utf-8")
            except OSError as error:
                raise InvalidRequest(f"cannot write {self.json_path}: {error.strerror}") from None
            return
        print(f"{self.profile}: {len(profile)} layers in PipeDream's profile order")
        print(plan_table(plan, profile))
        print()
        print(plan_diagram(plan))
