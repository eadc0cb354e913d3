"""Validation: a live replay of a June-trace slice agrees with the simulation of that slice.

``june_slice.csv`` is the slice ``--start 27557 --sessions 6`` of Adobe's June trace
(../shared/traces/sensei_june_60sec.csv): 6 sessions, 18 events of 1 and 8 GPUs over 51 trace
minutes, rows kept verbatim and ordered so that session recovery finds the same 6 sessions.
The fleet is real (a gateway and 3 host agents with 8 virtual GPUs each, kernels of 3 replicas
as the ``notebookos`` policy has them, so a cell can run wherever its GPUs are free); the
simulation gets the same fleet, fixed (``max_hosts = hosts``), and the same session model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernelfleet.replay.app import ReplayApp
from kernelfleet.scheduler.policies import NotebookOSPolicy
from kernelfleet.scheduler.simulator import SimulationConfig, simulate
from kernelfleet.scheduler.trace import read_trace
from kernelfleet.testing import start_fleet

SLICE = Path(__file__).with_name("june_slice.csv")
TIME_SCALE = 600  # 10 trace minutes per wall second: the 82-minute slice takes 8.2 s

# Tolerances, from what the two runs cannot share:
# - GPU-hours, 5%: every live cell holds its kernel some ms beyond its scaled duration (the
#   request, the reply and the idle status cross the gateway; the executor commits its LEAD
#   through Raft), and each session's later cells shift by that much. At 600x, 10 ms of wall
#   time is 6 trace seconds; the slice's 18 cells (3-8 trace minutes each) grow by 1-3% and its
#   82-minute window by 0.5-2%. Measured with 3 replicas on a busy 2-core machine: committed
#   +2.5 to +3.9%, provisioned +0.6 to +2.0% (with 1 replica: +0.8 to +1.0%, +0.4 to +0.5%).
# - Start delay, 0.5 wall seconds: the simulator has no protocol overhead, and in this
#   uncontended slice no cell waits, so it predicts 0; a live cell starts when the gateway has
#   relayed the request and the kernel's busy status (measured p99: 9-16 ms; 0.5 s leaves room for
#   a loaded 2-core machine). In trace seconds this is 600 times larger, so the delay check is
#   made in wall seconds.
GPU_HOURS_TOLERANCE = 0.05
WALL_DELAY_TOLERANCE_S = 0.5


def relative(live: float, simulated: float) -> float:
    return (live - simulated) / simulated


@pytest.mark.timeout(90)
def test_live_replay_agrees_with_the_simulation(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    fleet = start_fleet(tmp_path / "fleet", hosts=3, gpus=8, replicas=3)
    started = time.monotonic()
    try:
        app = ReplayApp()
        app.initialize(
            argv=[
                *("--trace", str(SLICE), "--gateway", fleet.url, "--token", fleet.token),
                *("--time-scale", str(TIME_SCALE), "--sessions", "0", "--json", str(out)),
                "--ReplayApp.progress=False",
            ]
        )
        app.start()
    finally:
        fleet.stop()
    wall = time.monotonic() - started
    document = json.loads(out.read_text(encoding="utf-8"))
    assumptions = document["assumptions"]
    assert (assumptions["hosts"], assumptions["gpus_per_host"]) == (3, 8)
    (name, live), *_ = document["policies"].items()
    assert (assumptions["policy"], assumptions["replicas"]) == ("notebookos", 3)

    config = SimulationConfig(
        hosts=3,
        gpus_per_host=8,
        max_hosts=3,
        session_lead_s=assumptions["session_lead_s"],
        session_linger_s=assumptions["session_linger_s"],
        idle_timeout_s=assumptions["idle_timeout_s"],
    )
    trace = read_trace(SLICE)
    policy = NotebookOSPolicy(config.autoscaling())
    assert name == policy.name  # the policy the gateway ran is the one simulated
    assert assumptions["replicas"] == policy.replicas
    simulated = simulate(trace, [policy], config)[name].as_json()

    assert live["failed_events"] == 0
    assert live["events"] == simulated["events"] == len(trace.events) == 18
    assert (live["migrations"], live["scale_outs"], live["scale_ins"]) == (0, 0, 0)
    assert simulated["start_delay_s"] == {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    provisioned = relative(live["gpu_hours_provisioned"], simulated["gpu_hours_provisioned"])
    committed = relative(live["gpu_hours_committed_by_cells"], simulated["gpu_hours_committed"])
    print(
        f"replay {wall:.1f} s; provisioned {live['gpu_hours_provisioned']} vs "
        f"{simulated['gpu_hours_provisioned']} ({provisioned:+.2%}); committed by cells "
        f"{live['gpu_hours_committed_by_cells']} vs {simulated['gpu_hours_committed']} "
        f"({committed:+.2%}); wall delay {live['start_delay_wall_s']}"
    )
    assert abs(provisioned) <= GPU_HOURS_TOLERANCE
    assert abs(committed) <= GPU_HOURS_TOLERANCE
    assert live["start_delay_wall_s"]["p99"] <= WALL_DELAY_TOLERANCE_S
    # the trace-second delays are the wall ones scaled (to the JSON's rounding)
    assert live["start_delay_s"]["p50"] == pytest.approx(
        live["start_delay_wall_s"]["p50"] * TIME_SCALE, abs=0.1
    )
