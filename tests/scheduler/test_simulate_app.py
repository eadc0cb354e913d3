"""``kernelfleet simulate`` end to end on small files, and (slow) on the June trace."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.simulator.app import SimulateApp
from kernelfleet.scheduler.simulator.config import SimulationConfig
from kernelfleet.scheduler.simulator.report import resolve_policy

from .json_fields import DOCUMENTED_FIELDS
from .traces import write_trace


def run_app(*argv: str) -> None:
    app = SimulateApp()
    app.initialize(argv=list(argv))
    app.start()


def simulate_json(trace: Path, out: Path, *argv: str) -> dict[str, Any]:
    """`run_app` on `trace` with `argv`, writing its JSON document to `out`; the document."""
    run_app("--trace", str(trace), "--json", str(out), *argv)
    document: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return document


def test_simulate_writes_exactly_the_documented_json(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = simulate_json(
        small_trace,
        tmp_path / "out.json",
        *("--policy", "notebookos", "--policy", "reservation"),
        *("--hosts", "4", "--gpus-per-host", "8"),
    )
    assert set(document) == {"assumptions", "policies"}
    assert document["assumptions"]["hosts"] == 4
    assert document["assumptions"]["session_linger_s"] == 1800.0
    assert list(document["policies"]) == ["notebookos", "reservation"]
    per_policy = document["assumptions"]["per_policy"]
    assert list(per_policy) == ["notebookos", "reservation"]
    assert per_policy["notebookos"]["replicas"] == 3
    assert per_policy["reservation"]["gpu_binding"] == "per-session"
    for assumed in per_policy.values():
        assert (
            assumed["autoscaling"]["buffer_hosts"]
            == document["assumptions"]["autoscale_buffer_hosts"]
        )
        assert assumed["autoscaling"]["min_hosts"] == 4
    for result in document["policies"].values():
        assert set(result) == set(DOCUMENTED_FIELDS)
        assert set(result["start_delay_s"]) == {"p50", "p95", "p99"}
        assert result["events"] == 4
    printed = capsys.readouterr().out
    assert "4 events, 3 sessions" in printed
    assert "session_linger_s" in printed
    assert "notebookos:" in printed
    assert "buffer 1 host(s)" in printed


def test_model_parameters_are_configurable(small_trace: Path, tmp_path: Path) -> None:
    document = simulate_json(
        small_trace,
        tmp_path / "out.json",
        *("--policy", "fcfs-batch"),
        "--SimulateApp.state_load_s=100",
        "--SimulateApp.container_start_s=0",
    )
    assert document["assumptions"]["state_load_s"] == 100.0
    assert document["policies"]["fcfs-batch"]["start_delay_s"]["p50"] == 100.0


def test_bad_input_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_trace(tmp_path / "bad.csv", "0,1,0,0,a,-3,0\n")
    with pytest.raises(SystemExit) as exited:
        run_app("--trace", str(bad))
    assert exited.value.code == 2
    assert "line 2: negative duration -3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_app("--trace", str(bad), "--policy", "nope")
    assert "unknown policy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_app()
    assert "--trace FILE" in capsys.readouterr().err


def test_events_larger_than_any_host_are_counted_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = write_trace(tmp_path / "big.csv", "0,1,0,0,a,10,0\n1,16,0,0,a,10,0\n")
    run_app("--trace", str(big), "--policy", "notebookos", "--SimulateApp.progress=False")
    printed = capsys.readouterr().out
    assert "notebookos: 1 event(s) rejected, not simulated; first: line 3: needs more GPUs" in (
        printed
    )


def test_plot_needs_matplotlib_or_draws(small_trace: Path, tmp_path: Path, capsys) -> None:
    png = tmp_path / "out.png"
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(SystemExit):
            run_app("--trace", str(small_trace), "--plot", str(png))
        assert "pip install matplotlib" in capsys.readouterr().err
    else:
        run_app("--trace", str(small_trace), "--plot", str(png))
        assert png.stat().st_size > 0


def test_resolve_policy_knows_the_builtins() -> None:
    for name in ("notebookos", "reservation", "fcfs-batch"):
        assert resolve_policy(name, SimulationConfig().autoscaling()).name == name
    with pytest.raises(InvalidRequest, match="known policies: fcfs-batch, notebookos"):
        resolve_policy("nope", SimulationConfig().autoscaling())


@pytest.mark.slow
def test_june_trace_three_policies(june_trace: Path, tmp_path: Path) -> None:
    """The whole June trace under the three policies; how long it took is printed (a figure,
    not a limit: the suite runs on busy machines)."""
    started = time.monotonic()
    document = simulate_json(june_trace, tmp_path / "june.json", "--SimulateApp.progress=False")
    print(f"the June trace, three policies: {time.monotonic() - started:.1f} s")
    policies = document["policies"]
    for result in policies.values():
        assert result["events"] == 30_909
    reservation, notebookos = policies["reservation"], policies["notebookos"]
    assert notebookos["gpu_hours_provisioned"] < reservation["gpu_hours_provisioned"]
    assert notebookos["gpu_hours_committed"] < reservation["gpu_hours_committed"]
    assert reservation["start_delay_s"]["p50"] <= notebookos["start_delay_s"]["p50"]


def test_the_floor_share_and_steady_knobs_reach_the_output(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = simulate_json(
        small_trace,
        tmp_path / "out.json",
        *("--policy", "notebookos"),
        "--SimulateApp.scale_in_idle_s=600",
        "--SimulateApp.warm_quantile=0.9",
        "--SimulateApp.progress=False",
    )
    printed = capsys.readouterr().out
    assert "Floor: " in printed
    assert "from a reservation run added as the reference (not listed)" in printed
    assert "saving %" in printed
    assert "a host released after 600 s idle" in printed
    assert "within 90 s at the 0.9 quantile" in printed  # lead: 60 s scale-out + 30 s round
    assert set(document) == {"assumptions", "policies"}
    result = document["policies"]["notebookos"]
    assert result["gpu_hours_floor"] == pytest.approx((10 + 5 + 4 * 30 + 8 * 60) / 60, abs=1e-3)
    assert result["gpu_hours_reservation"] > result["gpu_hours_floor"]
    assert result["saving_share"] is not None
    scaling = document["assumptions"]["per_policy"]["notebookos"]["autoscaling"]
    assert (scaling["scale_in_idle_s"], scaling["warm_lead_s"]) == (600.0, 90.0)


def test_a_trained_demand_model_warms_hosts_before_the_daily_burst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every day at 09:00 eight 8-GPU cells start together for 3 h: under the reactive rule five
    # of them wait for hosts each day; the model, trained on the first 7 days, has the hosts
    # up before 09:00 on the two days after
    pytest.importorskip("sklearn")
    from kernelfleet.scheduler.demand_app import DemandTrainApp

    rows = [
        f"{i},8,{day * 1440 + 540},0,m,180,0"
        for i, day in enumerate(d for d in range(9) for _ in range(8))
    ]
    bursts = write_trace(tmp_path / "bursts.csv", "\n".join(rows) + "\n")
    model = tmp_path / "model.json"
    train = DemandTrainApp()
    train.initialize(["--trace", str(bursts), "--out", str(model), "--DemandTrainApp.trees=10"])
    train.start()
    assert "forest MAE" in capsys.readouterr().out
    delays = {}
    for name, extra in (("reactive", []), ("model", [f"--SimulateApp.demand_model={model}"])):
        out = tmp_path / f"{name}.json"
        run_app("--trace", str(bursts), "--policy", "packing", "--json", str(out),
                "--SimulateApp.progress=False", *extra)  # fmt: skip
        delays[name] = json.loads(out.read_text())["policies"]["packing"]["start_delay_s"]
    assert f"Autoscaling: demand model {model}, busy GPUs 600 s ahead" in capsys.readouterr().out
    assert delays["reactive"]["p95"] >= 60
    assert delays["model"]["p95"] < delays["reactive"]["p95"]


def test_a_demand_model_it_cannot_use_leaves_the_reactive_rule(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corrupt = tmp_path / "model.json"
    corrupt.write_text("{", encoding="utf-8")
    run_app("--trace", str(small_trace), "--policy", "packing", "--SimulateApp.progress=False",
            f"--SimulateApp.demand_model={corrupt}")  # fmt: skip
    captured = capsys.readouterr()
    assert f"Autoscaling: reactive (demand model {corrupt} not used)" in captured.out
    assert "not a JSON demand model" in captured.err


def test_training_on_a_trace_too_short_says_so(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelfleet.scheduler.demand_app import DemandTrainApp

    app = DemandTrainApp()
    app.initialize(["--trace", str(small_trace), "--out", str(tmp_path / "m.json")])
    with pytest.raises(SystemExit) as exited:
        app.start()
    assert exited.value.code == 2
    assert "too short to train on: 51 steps of 60 s" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--SimulateApp.spot_price=-1", "host kind parameter spot_price must be >= 0, not -1.0"),
        (
            "--SimulateApp.revocation_rate_per_hour=1e9",
            "host kind parameter revocation_rate_per_hour is 1000000000.0: above 60",
        ),
        ("--SimulateApp.on_demand_price=nan", "on_demand_price must be >= 0, not nan"),
    ],
)
def test_absurd_prices_and_rates_exit_2_naming_the_field(
    small_trace: Path, capsys: pytest.CaptureFixture[str], option: str, says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_app("--trace", str(small_trace), option)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_mixed_fleet_prints_dollars_and_revocations(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    run_app(
        "--trace", str(small_trace), "--policy", "packing", "--SimulateApp.spot_share=0.5",
        "--SimulateApp.progress=False", "--json", str(out),
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "dollars" in printed
    assert "kernels lost" in printed
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["assumptions"]["spot_share"] == 0.5
    assert document["assumptions"]["spot_replicas_max"] == -1
    packing = document["policies"]["packing"]
    assert packing["dollars"] > 0
    assert packing["kernels_lost"] == 0
