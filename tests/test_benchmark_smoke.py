"""The benchmark script still runs end to end (tiny counts: the figures themselves mean nothing)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cell_roundtrip.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cell_roundtrip_benchmark_runs(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, str(SCRIPT), "--cells", "3", "--warmup", "1", "--starts", "1"]
    result = subprocess.run(
        [*command, "--json", str(out)], capture_output=True, text=True, timeout=200
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert set(figures["configurations"]) == {"A", "B", "C", "D", "E"}
    for configuration in figures["configurations"].values():
        assert configuration["roundtrip_ms"]["n"] == 3
        assert configuration["kernel_start_s"]["median"] > 0
    assert set(figures["ratios"]) == {"D/B", "C/A", "E/B"}
    assert "Like-for-like" in result.stdout


START_DELAY = SCRIPT.with_name("start_delay.py")
SCENARIOS = {"local", "fleet-0gpu", "uncontended", "contended"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_start_delay_benchmark_runs(tmp_path):
    out = tmp_path / "start_delay.json"
    cells, seconds = 3, 0.3
    command = [
        sys.executable, str(START_DELAY), "--hosts", "2", "--gpus-per-host", "1",
        "--replicas", "2", "--cells", str(cells), "--cell-seconds", str(seconds),
        "--json", str(out),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(out.read_text())
    scenarios = report["scenarios"]
    assert set(scenarios) == SCENARIOS
    assert [scenarios[s]["kernels"] for s in ("local", "uncontended", "contended")] == [2, 2, 4]
    for name, scenario in scenarios.items():
        delay = scenario["start_delay"]
        assert delay["n"] == scenario["kernels"] * cells, name
        assert len(scenario["timings"]) == delay["n"], name
        assert 0 < delay["p50_ms"] <= delay["p95_ms"] <= delay["p99_ms"] <= delay["max_ms"], name
        if name != "local":
            gateway = scenario["gateway_histogram"]
            assert gateway["n"] == delay["n"], f"{name}: the gateway's histogram saw other cells"
            assert gateway["buckets"]["+Inf"] == delay["n"], name
            # The gateway's interval lies inside the client's, but it stamps the end just
            # after relaying execute_input: allow a little for that, not a timing target.
            nested = delay["mean_ms"] * 1.1 + 2
            assert 0 < gateway["mean_ms"] <= nested, f"{name}: the gateway's is nested"
    assert scenarios["uncontended"]["cells_waited"] == 0, "one GPU per kernel: nobody waits"
    contended = scenarios["contended"]
    assert contended["cells_waited"] >= cells, "two kernels per GPU: cells wait for one"
    assert contended["start_delay"]["max_ms"] >= seconds * 1000 / 2, "a wait lasts a cell"
    assert contended["start_delay"]["p50_ms"] > scenarios["uncontended"]["start_delay"]["p50_ms"]
    gauges = contended["gateway_gauges"]
    assert gauges["samples"] > 0
    assert gauges["queued_fraction"] > 0, "the gateway's queued_cells gauge saw cells queue"
    assert report["queueing"]["kernels_per_gpu"] == 2
    assert report["ratios"]["uncontended_p50_over_local_p50"] > 0
    assert "uncontended p50 / local p50" in result.stdout
