"""benchmarks/failover.py still runs end to end (one round, one mode: the figures mean nothing)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "failover.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_failover_benchmark_runs(tmp_path):
    out = tmp_path / "failover.json"
    command = [sys.executable, str(SCRIPT), "--rounds", "1", "--quiet-seconds", "1", "--load", "1"]
    path = os.pathsep.join(p for p in (str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # this checkout's code, in its processes too
    result = subprocess.run(
        [*command, "--modes", "link", "--json", str(out)],
        capture_output=True, text=True, timeout=200, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (figures,) = json.loads(out.read_text())
    assert figures["mode"] == "link"
    assert len(figures["failover_s"]) == 1
    assert figures["failover_s"][0] > 0
    assert figures["false_host_losses"] == 0
    assert "failover p50" in result.stdout
