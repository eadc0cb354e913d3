"""``kernelfleet replay``: drive a live gateway with a trace, as a population of notebook users.

    kernelfleet replay --trace FILE --gateway URL --token T [--time-scale X] [--sessions K]
        [--start S] [--json OUT.json] [--plot OUT.png]

Takes the slice of sessions starting at or after trace minute S (the first K of them), replays
it X times faster than real time, and prints (and with ``--json`` writes) the same document as
``kernelfleet simulate``, under the policy the gateway runs (``GET /api/fleet``; ``live`` from a
gateway too old to say), which ``"assumptions"`` also records with the gateway's replicas per
kernel. The session model's parameters are the simulator's traits, with the same defaults.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from traitlets import Bool, Float, Int, Unicode, default
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import FleetError, InvalidRequest
from kernelfleet.replay.client import GatewayClient
from kernelfleet.replay.driver import Replay, ReplayResult
from kernelfleet.replay.plan import ReplayTiming
from kernelfleet.scheduler.simulator.app import _model_trait
from kernelfleet.scheduler.simulator.plot import plot, require_matplotlib
from kernelfleet.scheduler.simulator.report import results_table
from kernelfleet.scheduler.trace import TRACE_HELP, Trace, read_trace

log = logging.getLogger("kernelfleet.replay.app")

#: what the assumptions record of the gateway's autoscaler (``GET /api/fleet`` → autoscaling)
AUTOSCALING_LIMITS = ("min_hosts", "max_hosts", "gpus_per_host")


class ReplayApp(Application):
    """Live trace replay against a running gateway."""

    name = "kernelfleet-replay"
    version = __version__
    description = "Replay a training trace against a live kernelfleet gateway and measure it."
    aliases = {
        "trace": "ReplayApp.trace",
        "gateway": "ReplayApp.gateway",
        "token": "ReplayApp.token",
        "time-scale": "ReplayApp.time_scale",
        "sessions": "ReplayApp.sessions",
        "start": "ReplayApp.start_min",
        "json": "ReplayApp.json_path",
        "plot": "ReplayApp.plot_path",
        "skip-bad-rows": "ReplayApp.skip_bad_rows",
    }

    trace = Unicode("", config=True, help=TRACE_HELP)
    gateway = Unicode(
        config=True, help="The gateway's URL. Default: $KERNELFLEET_GATEWAY_URL, else none."
    )
    token = Unicode(config=True, help="The gateway's token. Default: $KERNELFLEET_TOKEN.")
    time_scale = Float(
        60.0, config=True, help="Trace seconds per wall second (60: a trace minute a second)."
    )
    sessions = Int(20, config=True, help="Replay at most this many sessions (0: all).")
    start_min = Float(
        0.0, config=True, help="Take sessions starting at or after this trace minute."
    )
    json_path = Unicode("", config=True, help="Write the results as JSON to this file.")
    plot_path = Unicode("", config=True, help="Draw the results into this PNG (matplotlib).")
    skip_bad_rows = Bool(
        False, config=True, help="Skip (and count) bad trace rows instead of failing."
    )
    policy_name = Unicode(
        "",
        config=True,
        help="Name the results by this (default: the policy the gateway reports, else live); "
        "the gateway's own policy is still recorded under assumptions.",
    )
    kernel_name = Unicode("", config=True, help="Kernelspec to start (default: the gateway's).")
    poll_interval_s = Float(
        0.25, config=True, help="Wall seconds between polls of the fleet admin API."
    )
    cell_timeout_s = Float(
        120.0, config=True, help="Wall seconds a cell may overrun its duration before it fails."
    )
    kernel_start_allowance_s = Float(
        5.0,
        config=True,
        help="Wall seconds a kernel is started before the session model says (its start-up "
        "does not shrink with the time scale).",
    )
    progress = Bool(True, config=True, help="Print a progress line on stderr.")
    session_lead_s = _model_trait("session_lead_s")
    session_linger_s = _model_trait("session_linger_s")
    idle_timeout_s = _model_trait("idle_timeout_s")

    @default("gateway")
    def _default_gateway(self) -> str:
        return os.environ.get("KERNELFLEET_GATEWAY_URL", "")

    @default("token")
    def _default_token(self) -> str:
        return os.environ.get("KERNELFLEET_TOKEN", "")

    def timing(self) -> ReplayTiming:
        return ReplayTiming(
            time_scale=self.time_scale,
            session_lead_s=self.session_lead_s,
            session_linger_s=self.session_linger_s,
            idle_timeout_s=self.idle_timeout_s,
            kernel_start_allowance_s=self.kernel_start_allowance_s,
        )

    def start(self) -> None:
        try:
            document, outcome = asyncio.run(self._run())
        except FleetError as error:
            print(f"kernelfleet replay: {error.message}", file=sys.stderr)
            self.exit(2)
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(document, indent=2) + "\n", "utf-8")
        if self.plot_path:
            plot({outcome.result.policy: outcome.result}, self.plot_path)

    async def _run(self) -> tuple[dict[str, Any], ReplayResult]:
        """Replay, print the report; the JSON document and the result."""
        if not self.trace or not self.gateway:
            raise InvalidRequest("give the trace and the gateway: --trace FILE --gateway URL")
        if self.plot_path:
            require_matplotlib()  # fail before the long run
        timing = self.timing()
        trace = read_trace(self.trace, skip_bad_rows=self.skip_bad_rows)
        chosen = trace.select(self.start_min, self.sessions)
        client = GatewayClient(self.gateway, self.token)
        try:
            hosts = await client.hosts()
            fleet = await client.fleet()
            assumptions = self.assumptions(chosen, hosts, fleet)
            name = self.policy_name or assumptions["policy"] or "live"
            print(describe(trace, chosen, len(trace.skipped)))
            print(assumptions_text(assumptions))
            replay = Replay(
                client,
                chosen,
                timing,
                policy_name=name,
                poll_interval_s=self.poll_interval_s,
                cell_timeout_s=self.cell_timeout_s,
                kernel_name=self.kernel_name,
                progress=self._progress_line(),
            )
            started = time.monotonic()
            outcome = await replay.run()
        finally:
            client.close()
        if self.progress:
            print(file=sys.stderr)
        print(report_text(outcome, time.monotonic() - started))
        return {"assumptions": assumptions, "policies": {name: outcome.as_json()}}, outcome

    def assumptions(
        self, trace: Trace, hosts: list[dict[str, Any]], fleet: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """What the numbers depend on: the gateway's policy and replicas per kernel (from
        ``GET /api/fleet``; None from a gateway without it), the slice, the time scale, the
        session model, and the fleet as it was when the replay began, with the autoscaler's
        host limits and added hosts' size (None from a gateway that does not autoscale)."""
        alive = [h for h in hosts if h.get("state") == "alive"]
        sizes = sorted({int(h.get("gpus", {}).get("total", 0)) for h in alive})
        fleet = fleet or {}
        policy = fleet.get("policy")
        scaling = fleet.get("autoscaling")
        return {
            "gateway": self.gateway,
            "gateway_version": fleet.get("version"),
            "policy": policy if isinstance(policy, str) and policy else None,
            "replicas": fleet.get("replicas"),
            "time_scale": self.time_scale,
            "start_min": self.start_min,
            "sessions": len(trace.sessions),
            "hosts": len(alive),
            "gpus_per_host": sizes[0] if len(sizes) == 1 else sizes,
            "autoscaling": {key: scaling.get(key) for key in AUTOSCALING_LIMITS}
            if isinstance(scaling, dict)
            else None,
            "session_lead_s": self.session_lead_s,
            "session_linger_s": self.session_linger_s,
            "idle_timeout_s": self.idle_timeout_s,
            "kernel_start_allowance_s": self.kernel_start_allowance_s,
            "poll_interval_s": self.poll_interval_s,
        }

    def _progress_line(self) -> Any:
        if not self.progress:
            return None

        def show(done: int, total: int) -> None:
            sys.stderr.write(f"\rreplaying: {done}/{total} sessions ended")
            sys.stderr.flush()

        return show


def describe(trace: Trace, chosen: Trace, skipped: int) -> str:
    first = chosen.sessions[0].start_min
    last = max(s.end_min for s in chosen.sessions)
    return (
        f"Trace {trace.path}: {len(trace.events):,} events, {len(trace.sessions):,} sessions"
        + (f", {skipped:,} bad rows skipped" if skipped else "")
        + f"; replaying {len(chosen.sessions):,} sessions ({len(chosen.events):,} events) "
        f"from minute {first:g} to {last:g}"
    )


def assumptions_text(assumptions: dict[str, Any]) -> str:
    lines = ["Assumptions (change any with --ReplayApp.<name>=VALUE):"]
    lines += [f"  {name:<26} {value}" for name, value in assumptions.items()]
    return "\n".join(lines)


def report_text(outcome: ReplayResult, elapsed: float) -> str:
    """The simulator's table, then what only a live run has."""
    extra = outcome.as_json()
    wall = extra["start_delay_wall_s"]
    lines = [
        results_table({outcome.result.policy: outcome.result}),
        f"GPU-hours committed by the gateway's ledger (polled): "
        f"{outcome.result.gpu_hours_committed:,.3f}; by the replay's own cell timings: "
        f"{extra['gpu_hours_committed_by_cells']:,.3f}",
        f"start delay in wall seconds: p50 {wall['p50']:.4f}, p95 {wall['p95']:.4f}, "
        f"p99 {wall['p99']:.4f} (x{outcome.time_scale:g} in trace seconds above)",
        f"({elapsed:.1f} s of wall time)",
    ]
    if outcome.result.gpu_hours_busy > 0 and outcome.result.gpu_hours_committed == 0:
        lines.append(
            "note: the gateway reported no committed GPU while cells ran "
            "(a gateway that does not bind GPUs per cell); use gpu_hours_committed_by_cells"
        )
    if outcome.late_for_kernel:
        lines.append(
            f"note: {outcome.late_for_kernel} cell(s) were due before their kernel had started; "
            "their start delays include the rest of its start-up (the simulator counts none): "
            "raise --ReplayApp.kernel_start_allowance_s"
        )
    if (
        outcome.autoscaler is not None
        and outcome.autoscaler.scale_outs + outcome.autoscaler.scale_ins
    ):
        counts = outcome.autoscaler
        lines.append(
            f"the gateway's autoscaler: {counts.scale_outs} host(s) added (starting in "
            f"{counts.host_start_wall_s} wall s on average), {counts.scale_ins} removed; "
            f"{counts.migrations} replica(s) moved ({counts.migration_wall_s} wall s on average)"
        )
    if outcome.failures:
        lines.append(f"{len(outcome.failures)} event(s) failed; first: {outcome.failures[0]}")
    if outcome.failed_polls:
        lines.append(f"{outcome.failed_polls} poll(s) of the admin API failed")
    return "\n".join(lines)
