"""``kernelfleet pipeline-plan``: the JSON contract tools outside the project read, the table,
and bad input ending in one line and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelfleet.tools.pipeline.app import PipelinePlanApp
from kernelfleet.tools.pipeline.graphfile import read_graph_profile
from kernelfleet.tools.pipeline.planner import plan_pipeline

CONTRACT_KEYS = [
    "stages",
    "time_per_minibatch_s",
    "speedup_vs_data_parallel",
    "speedup_vs_one_worker",
]


def run(*argv: str) -> None:
    app = PipelinePlanApp()
    app.initialize(argv=list(argv))
    app.start()


def test_json_holds_exactly_the_contract(
    pipedream_profile: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    profile = pipedream_profile("vgg16")
    run("--profile", str(profile), "--workers", "4", "--bandwidth", "1.25e9", "--json", str(out))
    document = json.loads(out.read_text(encoding="utf-8"))
    assert list(document) == CONTRACT_KEYS
    assert document["stages"] == [
        {"layers": [0, 14], "replicas": 3},
        {"layers": [15, 39], "replicas": 1},
    ]
    for stage in document["stages"]:
        assert list(stage) == ["layers", "replicas"]
        assert all(type(n) is int for n in (*stage["layers"], stage["replicas"]))
    for key in CONTRACT_KEYS[1:]:
        assert type(document[key]) is float
    assert round(document["speedup_vs_data_parallel"], 2) == 2.87
    assert round(document["speedup_vs_one_worker"], 2) == 3.85
    plan = plan_pipeline(read_graph_profile(profile), 4, 1.25e9)
    assert document["time_per_minibatch_s"] == plan.time_per_minibatch_s
    assert capsys.readouterr().out == ""  # with --json, only the file


def test_without_json_prints_a_table_and_a_diagram(
    pipedream_profile: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run("--profile", str(pipedream_profile("vgg16")), "--workers", "4", "--bandwidth", "1.25e9")
    out = capsys.readouterr().out
    assert "40 layers in PipeDream's profile order" in out
    assert "    0  0-14              3" in out
    assert "    1  15-39             1" in out
    assert "speed-up 2.87x over 4-way data parallelism" in out
    assert "3.85x over one worker" in out
    assert "[stage 0: layers 0-14 on w0-w2] " + "#" * 24 in out
    assert "[stage 1: layers 15-39 on w3] " in out


def test_levels_plan_machines_of_gpus(
    pipedream_profile: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    profile = str(pipedream_profile("vgg16"))
    run("--profile", profile, "--levels", "4:1e10,2:1.25e9", "--json", str(out))
    document = json.loads(out.read_text(encoding="utf-8"))
    assert list(document) == CONTRACT_KEYS
    assert [s["replicas"] for s in document["stages"]] == [4, 2, 1, 1]
    run("--profile", profile, "--levels", "4:1e10,2:1.25e9")
    printed = capsys.readouterr().out
    assert "on 8 workers (4 at 1e+10 B/s x 2 at 1.25e+09 B/s, innermost first)" in printed
    assert "sync is paid level by level" in printed


BAD_NODE = (
    "node1 -- Conv -- forward_compute_time=oops, backward_compute_time=1, activation_size=1, "
    "parameter_size=1\n"
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "4", "--bandwidth", "1e9"], "give the model's profile"),
        (["--profile", "{missing}", "--workers", "4", "--bandwidth", "1e9"], "no profile at"),
        (["--profile", "{bad}", "--workers", "4", "--bandwidth", "1e9"], "line 1: node node1"),
        (["--profile", "{good}", "--bandwidth", "1e9"], "give --workers N"),
        (["--profile", "{good}", "--workers", "0", "--bandwidth", "1e9"], "give --workers N"),
        (["--profile", "{good}", "--workers", "two", "--bandwidth", "1e9"], "expected an int"),
        (["--profile", "{good}", "--workers", "2"], "give --bandwidth"),
        (["--profile", "{good}", "--workers", "2", "--bandwidth", "inf"], "give --bandwidth"),
        (
            ["--profile", "{good}", "--workers", "2", "--bandwidth", "1e9", "--memory", "-5"],
            "negative",
        ),
        (
            ["--profile", "{good}", "--workers", "2", "--bandwidth", "1e9", "--memory", "10"],
            "layer 0 (node2, Conv) alone holds",
        ),
        (
            ["--profile", "{good}", "--workers", "2", "--bandwidth", "1e9", "--json", "{nodir}"],
            "cannot write",
        ),
        (["--profile", "{good}", "--levels", "4:1e10,2"], "bad --levels '4:1e10,2'"),
        (["--profile", "{good}", "--levels", "0:1e10"], "bad --levels"),
        (["--profile", "{good}", "--levels", "2:1e10", "--workers", "2"], "not both"),
        (["--profile", "{good}", "--levels", "2:1e10", "--memory", "1e9"], "not modelled"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "bad.txt").write_text(BAD_NODE, encoding="utf-8")
    good = tmp_path / "good.txt"
    good.write_text(
        "node1 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=8, "
        "parameter_size=0\n"
        "node2 -- Conv -- forward_compute_time=2, backward_compute_time=4, activation_size=64, "
        "parameter_size=128\n\tnode1 -- node2\n",
        encoding="utf-8",
    )
    paths = {
        "missing": tmp_path / "absent.txt",
        "bad": tmp_path / "bad.txt",
        "good": good,
        "nodir": tmp_path / "no" / "such" / "dir.json",
    }
    with pytest.raises(SystemExit) as caught:
        run(*(a.format(**paths) for a in args))
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernelfleet pipeline-plan: ")
    assert message in err
    assert len(err.splitlines()) == 1


def test_the_kernelfleet_command_dispatches_it(
    pipedream_profile: Callable[[str], Path], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    base = [sys.executable, "-m", "kernelfleet", "pipeline-plan", "--workers", "2"]
    ok = subprocess.run(
        [*base, "--profile", str(pipedream_profile("alexnet")), "--bandwidth", "1e9"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "speed-up" in ok.stdout
    missing = subprocess.run(
        [*base, "--profile", str(tmp_path / "absent.txt"), "--bandwidth", "1e9"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith(f"no profile at {tmp_path / 'absent.txt'}")


README = Path(__file__).resolve().parents[3] / "README.md"
SHARED = README.parent.parent / "shared"


@pytest.mark.skipif(not (SHARED / "data" / "pipedream").is_dir(), reason="../shared/data is absent")
def test_the_readme_s_command_runs_as_written_and_writes_what_it_says(tmp_path: Path) -> None:
    marker = "<!-- tested by tests/tools/pipeline/test_app.py: pipeline-plan -->"
    text = README.read_text(encoding="utf-8")
    block = text[text.index(marker) :].split("```bash\n", 1)[1].split("\n```\n", 1)[0]
    clone = tmp_path / "clone"  # a clone's folder with ../shared beside it, as the README says
    clone.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)
    ran = subprocess.run(["bash", "-c", block], cwd=clone, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    plan = json.loads((clone / "vgg16.json").read_text())
    assert plan["stages"] == [
        {"layers": [0, 14], "replicas": 3},
        {"layers": [15, 39], "replicas": 1},
    ]
    after = text[text.index(marker) :].split("on one worker, ", 1)[1]
    said = after.split("\N{MULTIPLICATION SIGN}", 1)[0]
    assert f"{plan['speedup_vs_data_parallel']:.2f}" == said
