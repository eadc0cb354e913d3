"""``kernelfleet simulate``: replay a trace through policies on a simulated fleet.

    kernelfleet simulate --trace FILE --policy notebookos --policy reservation \
        [--hosts N] [--gpus-per-host G] [--json OUT.json] [--plot OUT.png]

Prints the assumptions and a table; ``--json`` writes `report.as_document`. Every model parameter
(`SimulationConfig`) is a configurable trait: ``--SimulateApp.scale_out_delay_s=120``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from traitlets import Bool, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.demand_model import DemandModel, load_or_warn
from kernelfleet.scheduler.simulator import simulate
from kernelfleet.scheduler.simulator.config import EXPLANATIONS, SimulationConfig
from kernelfleet.scheduler.simulator.plot import plot, require_matplotlib
from kernelfleet.scheduler.simulator.report import (
    as_document,
    assumptions_text,
    floor_text,
    resolve_policy,
    results_table,
)
from kernelfleet.scheduler.trace import TRACE_HELP, read_trace

log = logging.getLogger("kernelfleet.scheduler.simulator.app")

_DEFAULTS = SimulationConfig()


def _model_trait(name: str) -> Any:
    """A configurable trait for one `SimulationConfig` field, with its default and help."""
    default = getattr(_DEFAULTS, name)
    help_text = f"{EXPLANATIONS[name]}."
    if isinstance(default, bool):
        return Bool(default, config=True, help=help_text)
    if isinstance(default, int):
        return Int(default, config=True, help=help_text)
    return Float(default, config=True, help=help_text)


class SimulateApp(Application):
    """Trace-driven simulation of the scheduling policies."""

    name = "kernelfleet-simulate"
    version = __version__
    description = "Replay a training trace through scheduling policies on a simulated GPU fleet."
    aliases = {
        "trace": "SimulateApp.trace",
        "policy": "SimulateApp.policies",
        "hosts": "SimulateApp.hosts",
        "gpus-per-host": "SimulateApp.gpus_per_host",
        "json": "SimulateApp.json_path",
        "plot": "SimulateApp.plot_path",
        "skip-bad-rows": "SimulateApp.skip_bad_rows",
    }

    trace = Unicode("", config=True, help=TRACE_HELP)
    policies = List(
        Unicode(),
        ["notebookos", "reservation", "fcfs-batch"],
        config=True,
        help="Policies to simulate, in order (repeat --policy for several).",
    )
    json_path = Unicode("", config=True, help="Write the results as JSON to this file.")
    plot_path = Unicode("", config=True, help="Draw the results into this PNG (matplotlib).")
    skip_bad_rows = Bool(
        False, config=True, help="Skip (and count) bad trace rows instead of failing."
    )
    progress = Bool(True, config=True, help="Print a progress line on stderr.")
    demand_model = Unicode(
        "",
        config=True,
        help="A demand model file ('kernelfleet demand train'): the autoscaler adds hosts for "
        "the busy GPUs it predicts. Missing, unreadable or trained for another gpus_per_host: "
        "a warning, and the reactive rule.",
    )

    hosts = _model_trait("hosts")
    gpus_per_host = _model_trait("gpus_per_host")
    max_hosts = _model_trait("max_hosts")
    scale_out_delay_s = _model_trait("scale_out_delay_s")
    autoscale_interval_s = _model_trait("autoscale_interval_s")
    autoscale_headroom = _model_trait("autoscale_headroom")
    autoscale_buffer_hosts = _model_trait("autoscale_buffer_hosts")
    max_scale_in = _model_trait("max_scale_in")
    count_waiting_gpus = _model_trait("count_waiting_gpus")
    scale_in_headroom = _model_trait("scale_in_headroom")
    scale_in_idle_s = _model_trait("scale_in_idle_s")
    min_host_lifetime_s = _model_trait("min_host_lifetime_s")
    warm_quantile = _model_trait("warm_quantile")
    warm_lead_s = _model_trait("warm_lead_s")
    arrival_window_s = _model_trait("arrival_window_s")
    migration_cost_s = _model_trait("migration_cost_s")
    container_start_s = _model_trait("container_start_s")
    state_load_s = _model_trait("state_load_s")
    state_save_s = _model_trait("state_save_s")
    session_lead_s = _model_trait("session_lead_s")
    session_linger_s = _model_trait("session_linger_s")
    idle_timeout_s = _model_trait("idle_timeout_s")
    ratio_window_s = _model_trait("ratio_window_s")
    on_demand_price = _model_trait("on_demand_price")
    spot_price = _model_trait("spot_price")
    spot_share = _model_trait("spot_share")
    revocation_rate_per_hour = _model_trait("revocation_rate_per_hour")
    notice_s = _model_trait("notice_s")
    spot_extra_start_s = _model_trait("spot_extra_start_s")
    spot_replicas_max = _model_trait("spot_replicas_max")
    revocation_seed = _model_trait("revocation_seed")

    @validate("policies")
    def _check_policies(self, proposal: dict) -> list[str]:
        if not proposal["value"]:
            raise TraitError("give at least one --policy")
        return list(proposal["value"])

    def model(self) -> SimulationConfig:
        """The `SimulationConfig` from the traits; `InvalidRequest` if a value is impossible."""
        return SimulationConfig(**{f.name: getattr(self, f.name) for f in fields(SimulationConfig)})

    def start(self) -> None:
        try:
            self._run()
        except InvalidRequest as error:
            print(f"kernelfleet simulate: {error.message}", file=sys.stderr)
            self.exit(2)

    def _run(self) -> None:
        if not self.trace:
            raise InvalidRequest("give the trace file: --trace FILE")
        if self.plot_path:
            require_matplotlib()  # fail before the long run
        config = self.model()
        policies = [resolve_policy(name, config.autoscaling()) for name in self.policies]
        trace = read_trace(self.trace, skip_bad_rows=self.skip_bad_rows)
        print(
            f"Trace {trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions"
            + (f", {len(trace.skipped):,} bad rows skipped" if trace.skipped else "")
        )
        print(assumptions_text(config, policies))
        model = None
        if self.demand_model:
            model = load_or_warn(self.demand_model, config.gpus_per_host, self.log)
        print(_model_line(self.demand_model, model))
        started = time.monotonic()
        results = simulate(
            trace, policies, config, self._progress_line(), reference=True, demand_model=model
        )
        elapsed = time.monotonic() - started
        if self.progress:
            print(file=sys.stderr)
        print(floor_text(results))
        print(results_table(results))
        for result in results.values():
            if result.rejected_events:
                print(
                    f"{result.policy}: {result.rejected_events:,} event(s) rejected, not "
                    f"simulated; first: {'; '.join(result.rejections[:3])}"
                )
        print(f"({len(policies)} policies simulated in {elapsed:.1f} s)")
        if self.json_path:
            text = json.dumps(as_document(config, results), indent=2)
            Path(self.json_path).write_text(text + "\n", encoding="utf-8")
        if self.plot_path:
            plot(results, self.plot_path)
            print(f"plot written to {self.plot_path}")

    def _progress_line(self) -> Any:
        if not self.progress:
            return None
        last = [0.0]

        def show(name: str, fraction: float) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.5:
                last[0] = now
                bar = "#" * int(fraction * 30)
                sys.stderr.write(f"\rsimulating {name:<12} [{bar:<30}] {fraction:4.0%} of sessions")
                sys.stderr.flush()

        return show


def _model_line(path: str, model: DemandModel | None) -> str:
    """What the run's autoscaler follows: the demand model, or demand as it is."""
    if model is None:
        return "Autoscaling: reactive" + (f" (demand model {path} not used)" if path else "")
    return (
        f"Autoscaling: demand model {path}, busy GPUs {model.horizon_s:g} s ahead + "
        f"{model.margin_gpus:.1f} GPUs (quantile {model.quantile:g}), trained on "
        f"{model.trained.get('trace', '?')} up to {model.trained.get('until_s', 0) / 60:g} min"
    )
