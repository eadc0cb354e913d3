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
