"""Each training tool's benchmark runs as its docs say, at the smallest size, and writes its
JSON. Figures are printed, never asserted: they belong to the machine that measures them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize(
    ("script", "arguments"),
    [
        ("pipeline_schedules.py", "--ranks 2 --microbatches 2 --steps 2 --repeats 1 --width 32 "
         "--layers 4 --batch 8"),
        ("pufferfish_ddp.py", "--steps 2 --warmup-steps 2 --rounds 1 --batch 2 --image 8"),
        ("dataload_cache.py", "--items 40 --epochs 2 --sizes 50,100"),
        ("dataload_coordinate.py", "--consumers 2 --items 32 --batch 8 --cost-ms 1 --epochs 1 "
         "--rounds 1"),
        ("checkfreq_overhead.py", "--steps 20 --rounds 1 --epoch 10"),
    ],
)  # fmt: skip
def test_the_benchmark_runs_and_writes_its_figures(
    script: str, arguments: str, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments.split(), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text()), f"{script} wrote no figures"
