"""``%energy``: what a cell costs in energy, and the tuner of this cell's GPU settings.

::

    %energy measure CODE            time CODE, and the energy each bound GPU used
    %%energy measure                the same for the cell's body
    %%energy tune --slo 50ms [--knobs gpu_clock,mem_clock,power_limit,batch] [--trials 20]
                  [--batch 8,16,32 [--batch-var batch_size]] [--seed N] [--dry-run]
                                    tune this cell's GPUs: the body is the workload, run once
                                    per trial; the least energy whose run meets the SLO wins
    %energy tune --replay GPU:DATASET/NETWORK[/OPTIMIZER] --slo 1h [--trace DIR] ...
                                    the same tuner over Zeus's measured tables (no GPU needed)
    %energy reset                   this cell's GPUs back to their default settings

A thin shell over `kernelfleet.tools.energy`: parse, call, show. The ``batch`` knob is a
variable the body reads: ``--batch-var`` names it (``batch_size`` by default), ``--batch`` lists
its values; the tuner sets it before each run and leaves it at the chosen value. Bad arguments
raise ``UsageError`` with the usage; the tool's refusals (no GPU bound, an unknown knob, the host
not allowed to change a setting, no trace) are one-line errors, and the defaults stay in place.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from functools import cached_property
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from kernelfleet.kernels.magics.parsing import MagicParser, count_in, parse

DEFAULT_BATCH_VARIABLE = "batch_size"
MAX_TRIALS = 1000
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^((?:\d+\.?\d*)|(?:\.\d+))(us|µs|ms|s|min|h)?$")


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%energy`` and ``%%energy``."""
    ipython.register_magics(EnergyMagics)


def duration(text: str) -> float:
    """An argparse ``type``: a time above 0 with a unit (``50ms``, ``1.5s``, ``2min``, ``1h``,
    ``250us``; a bare number is seconds), in seconds."""
    match = _DURATION.match(text.strip())
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError("expected a time above 0, such as 50ms, 1.5s or 1h")
    return value


def names(text: str) -> list[str]:
    """An argparse ``type``: comma-separated names."""
    found = [name.strip() for name in text.split(",") if name.strip()]
    if not found:
        raise argparse.ArgumentTypeError("expected names separated by commas")
    return found


def numbers(text: str) -> list[float]:
    """An argparse ``type``: comma-separated numbers above 0 (batch sizes)."""
    try:
        found = [float(word) for word in text.split(",") if word.strip()]
    except ValueError:
        found = []
    if not found or not all(0 < v < float("inf") for v in found):
        raise argparse.ArgumentTypeError("expected numbers above 0 separated by commas")
    return found


def energy_parser() -> MagicParser:
    parser = MagicParser(
        prog="%energy",
        description="The energy a cell uses per GPU, and PolyThrottle's tuner of GPU clocks, "
        "power limit and batch size under a latency SLO.",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    commands.add_parser(
        "measure", help="time and energy per GPU of CODE, or of the cell's body",
        description="%energy measure CODE, or %%energy measure above a cell: run it once; "
        "show its time and the energy each GPU bound to the cell used (NVML's counters).",
    )  # fmt: skip
    tune = commands.add_parser(
        "tune",
        help="the least energy under a latency SLO",
        description="Search GPU clock, memory clock, power limit and batch size for the least "
        "energy per item whose run meets the SLO (constrained Bayesian optimisation). Above a "
        "cell, the body is the workload, run once per trial on this cell's GPUs; with "
        "--replay, a Zeus power table stands in for a GPU.",
    )
    tune.add_argument("--slo", type=duration, required=True, metavar="TIME",
                      help="the latency bound of one run: 50ms, 1.5s, 1h")  # fmt: skip
    tune.add_argument("--knobs", type=names, metavar="K1,K2",
                      help="gpu_clock, mem_clock, power_limit, batch (default: all)")  # fmt: skip
    tune.add_argument("--trials", type=count_in(1, MAX_TRIALS), default=20, metavar="N",
                      help="evaluations at most (default 20)")  # fmt: skip
    tune.add_argument("--batch", type=numbers, metavar="B1,B2",
                      help="the batch values to try (offers the batch knob)")  # fmt: skip
    tune.add_argument("--batch-var", default=DEFAULT_BATCH_VARIABLE, metavar="NAME",
                      help=f"the body's batch variable ({DEFAULT_BATCH_VARIABLE})")  # fmt: skip
    tune.add_argument("--seed", type=count_in(0, 2**31 - 1), metavar="N", help="the search's seed")
    tune.add_argument("--dry-run", action="store_true",
                      help="show the space and the host's NVML calls; run nothing")  # fmt: skip
    tune.add_argument("--replay", metavar="GPU:DATASET/NETWORK",
                      help="tune over a Zeus power table instead of this cell's GPUs")  # fmt: skip
    tune.add_argument("--trace", metavar="DIR",
                      help="the folder of Zeus's summary_power_<gpu>.csv "
                      "(default: $KERNELFLEET_ZEUS_TRACE)")  # fmt: skip
    commands.add_parser(
        "reset", help="this cell's GPUs back to their defaults",
        description="Put every GPU bound to this cell back to its default clocks and power "
        "limit (the host agent also does it when the cell's GPUs are released).",
    )  # fmt: skip
    return parser


@magics_class
class EnergyMagics(Magics):
    """``%energy`` and ``%%energy``; `client_factory` makes the `FleetClient` (the kernel's
    own by default), `meter_factory` the `EnergyMeter` of a measurement (the cell's GPUs')."""

    def __init__(
        self,
        shell: Any = None,
        client_factory: Callable[[], Any] | None = None,
        meter_factory: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(shell)
        self.client_factory = client_factory
        self.meter_factory = meter_factory

    @cached_property
    def parser(self) -> MagicParser:
        return energy_parser()

    @line_cell_magic
    def energy(self, line: str, cell: str | None = None) -> Any:
        """Energy of a cell per GPU, and the GPU-settings tuner (``%energy --help``)."""
        command, _, rest = line.strip().partition(" ")
        if command == "measure" and rest.strip() not in ("-h", "--help"):
            code = cell if cell is not None else rest
            if not code.strip():
                raise UsageError("nothing to measure: %energy measure CODE, or %%energy measure")
            return self._measure(code)
        args = parse(self.parser, line)
        if args is None:
            return None
        if args.command == "tune":
            return self._tune(args, cell)
        if args.command == "reset":
            self._fleet_backend(lambda batch: None).reset()
            print("this cell's GPUs are back to their default settings")
            return None
        self.parser.print_help()
        return None

    # ---- measure ---------------------------------------------------------------------------

    def _measure(self, code: str) -> Any:
        from kernelfleet.tools.energy.meter import EnergyMeter
        from kernelfleet.tools.energy.report import measure_view

        meter = self.meter_factory() if self.meter_factory else EnergyMeter.for_cell()
        run = self._runner(code)
        measurement, _ = meter.measure(run)
        return measure_view(measurement, meter.why)

    def _runner(self, code: str) -> Callable[[], None]:
        """`code` (IPython syntax) as a function that runs it in the user's namespace."""
        source = self.shell.transform_cell(code) if self.shell is not None else code
        compiled = compile(source, "<%energy cell>", "exec")
        namespace = self.shell.user_ns if self.shell is not None else {}
        return lambda: exec(compiled, namespace)

    # ---- tune ------------------------------------------------------------------------------

    def _tune(self, args: argparse.Namespace, cell: str | None) -> Any:
        from kernelfleet.tools.energy.replay import ReplayBackend
        from kernelfleet.tools.energy.report import tune_view
        from kernelfleet.tools.energy.tuner import tune

        knobs = args.knobs
        if knobs is not None and "batch" in knobs and not args.batch and not args.replay:
            raise UsageError("the batch knob needs its values: --batch 8,16,32")
        if args.replay:
            if cell is not None and cell.strip():
                raise UsageError("--replay tunes a recorded table: leave the cell's body empty")
            backend: Any = ReplayBackend.from_spec(args.replay, args.trace)
            if args.dry_run:
                return _space_view(backend.space(knobs), backend.name)
            return tune_view(tune(backend, args.slo, knobs=knobs, evaluations=args.trials,
                                  seed=args.seed))  # fmt: skip
        if args.dry_run:
            return self._dry_run(args, knobs)
        if cell is None or not cell.strip():
            raise UsageError("%%energy tune runs the cell's body as the workload: put it above "
                             "a cell (or tune a table with --replay)")  # fmt: skip
        run = self._runner(cell)
        user_ns = self.shell.user_ns if self.shell is not None else {}
        had, before = args.batch_var in user_ns, user_ns.get(args.batch_var)

        def workload(batch: float | None) -> None:
            if batch is not None:
                user_ns[args.batch_var] = int(batch) if float(batch).is_integer() else batch
            run()

        backend = self._fleet_backend(workload, args.batch, before)
        try:
            result = tune(backend, args.slo, knobs=knobs, evaluations=args.trials, seed=args.seed)
        except BaseException:
            _restore(user_ns, args.batch_var, had, before)
            raise
        chosen = result.applied.get("batch") if result.best is not None else None
        if chosen is None:
            _restore(user_ns, args.batch_var, had, before)
        else:
            user_ns[args.batch_var] = int(chosen) if float(chosen).is_integer() else chosen
            print(f"{args.batch_var} = {user_ns[args.batch_var]} (the chosen batch)")
        return tune_view(result)

    def _dry_run(self, args: argparse.Namespace, knobs: list[str] | None) -> Any:
        from kernelfleet.kernels.magics.views import View
        from kernelfleet.tools.energy.report import dry_run_view

        backend = self._fleet_backend(lambda batch: None, args.batch)
        space = backend.space(knobs)
        sections = [_space_section(space, backend.name, args.trials)]
        lowest = space.setting([0] * len(space.knobs))
        for label, setting in (("the default setting", space.default()), ("the lowest", lowest)):
            from kernelfleet.tools.energy.knobs import describe

            calls = backend.dry_run(setting)
            sections.append(dry_run_view(describe(setting), calls, label))
        return View(*sections)

    def _fleet_backend(
        self, workload: Callable[[float | None], Any], batches: list[float] | None = None,
        batch_default: Any = None,
    ) -> Any:  # fmt: skip
        from kernelfleet.tools.energy.fleet import FleetBackend

        client = self._client()
        default = batch_default if isinstance(batch_default, int | float) else None
        return FleetBackend(client, workload, batches=batches or (), batch_default=default,
                            meter=self.meter_factory() if self.meter_factory else None)  # fmt: skip

    def _client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory()
        from kernelfleet.client import FleetClient

        return FleetClient.from_environment()


def _restore(namespace: dict[str, Any], name: str, had: bool, value: Any) -> None:
    if had:
        namespace[name] = value
    else:
        namespace.pop(name, None)


def _space_section(space: Any, backend: str, trials: int = 0) -> Any:
    from kernelfleet.kernels.magics.views import Section

    rows = tuple(
        (k.name, ", ".join(f"{v:g}" for v in k.values), f"{k.default:g}") for k in space.knobs
    )
    note = f"{space.size} settings" + (f"; would measure at most {trials}" if trials else "")
    return Section(f"search space of {backend}", note, ("knob", "values", "default"), rows)


def _space_view(space: Any, backend: str) -> Any:
    from kernelfleet.kernels.magics.views import View

    return View(_space_section(space, backend))
