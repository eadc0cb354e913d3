"""benchmarks/energy_tuner.py still runs end to end (one small table, one seed: the figures
themselves are docs/energy.md's)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "energy_tuner.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_energy_benchmark_runs_on_one_table(zeus_trace, tmp_path):
    out = tmp_path / "energy.json"
    command = [sys.executable, str(SCRIPT), "--trace", str(zeus_trace), "--seeds", "1",
               "--workers", "1", "--table", "p100:sentiment140/bert_base_uncased",
               "--json", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [row["level"] for row in rows] == ["default", "+10%", "tight"]
    assert report["summary"]["violating_best"] == 0
    for row in rows:
        assert row["feasible"] >= 1
        assert row["runs"][0]["evaluations"] <= 20
    assert "tables_passed_every_slo" in result.stdout
