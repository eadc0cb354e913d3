"""``kernelfleet simulate-jobs`` end to end on small files: the JSON interface, the table, and
bad input ending in one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kernelfleet.cli import KernelfleetApp
from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.jobs.app import (
    SimulateJobsApp,
    build_policy,
    parse_cluster,
    policy_options,
)
from kernelfleet.scheduler.jobs.shockwave import ShockwavePolicy

LINE = (
    "LM (batch size {batch})\tpython3 main.py\tlm\t--steps\t1\t{steps}\t{scale}\t1\t-1\t{arrival}"
)
THROUGHPUTS = {
    gpu: {
        f"('LM (batch size {batch})', {scale})": {"null": rate * scale * (1 + batch / 100)}
        for batch in (10, 20)
        for scale in (1, 2)
    }
    for gpu, rate in (("fast", 4.0), ("slow", 1.0))
}
RESULT_FIELDS = {"avg_jct_s", "makespan_s", "utilisation", "ftf_rho", "jobs"}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    trace = tmp_path / "jobs.trace"
    lines = [
        LINE.format(batch=10, steps=4000, scale=1, arrival=0),
        LINE.format(batch=20, steps=9000, scale=2, arrival=0),
        LINE.format(batch=10, steps=2000, scale=1, arrival=400),
    ]
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    throughputs = tmp_path / "throughputs.json"
    throughputs.write_text(json.dumps(THROUGHPUTS), encoding="utf-8")
    return {"trace": trace, "throughputs": throughputs, "json": tmp_path / "out.json"}


def run(*argv: str) -> None:
    app = SimulateJobsApp()
    app.initialize(argv=list(argv))
    app.start()


def base(files: dict[str, Path], *extra: str, cluster: str = "fast=2,slow=2") -> list[str]:
    return [
        "--trace", str(files["trace"]),
        "--throughputs", str(files["throughputs"]),
        "--cluster", cluster,
        "--json", str(files["json"]),
        *extra,
    ]  # fmt: skip


def test_writes_exactly_the_documented_json(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    policies = ["fifo", "max_min_fairness", "max_min_fairness_perf", "min_total_duration_perf"]
    run(*base(files, *[arg for name in policies for arg in ("--policy", name)]))
    document = json.loads(files["json"].read_text(encoding="utf-8"))
    assert list(document) == ["policies"]
    assert list(document["policies"]) == policies
    for result in document["policies"].values():
        assert set(result) == RESULT_FIELDS
        assert set(result["ftf_rho"]) == {"median", "p75", "max", "unfair_share"}
        assert result["jobs"] == 3
        assert 0 < result["utilisation"] <= 1
        assert result["makespan_s"] >= result["avg_jct_s"] > 0
    out = capsys.readouterr()
    assert "avg JCT h" in out.out
    assert "max_min_fairness_perf" in out.out
    assert "100% of jobs" in out.err


def test_seed_round_length_and_config_reach_the_run(files: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "options.json"
    config.write_text(json.dumps({"min_total_duration": {"reference_gpu_type": "slow"}}), "utf-8")
    run(*base(files, "--policy", "min_total_duration", "--round-s", "60", "--config", str(config)))
    short_rounds = json.loads(files["json"].read_text(encoding="utf-8"))["policies"]
    run(*base(files, "--policy", "min_total_duration", "--round-s", "3600"))
    long_rounds = json.loads(files["json"].read_text(encoding="utf-8"))["policies"]
    assert short_rounds != long_rounds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--policy", "nope"], "unknown job policy 'nope'"),
        (["--round-s", "0"], "--round-s must be positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    files: dict[str, Path], change: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(*base(files, *change))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert message in err[0]
    assert not files["json"].exists()


@pytest.mark.parametrize(
    ("cluster", "message"),
    [("fast=two", "bad --cluster 'fast=two'"), ("fast=2,a100=4", "no GPU type 'a100'")],
)
def test_a_bad_cluster_is_one_line_and_exit_code_2(
    files: dict[str, Path], cluster: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run(*base(files, cluster=cluster))
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line


def test_a_malformed_trace_line_is_named(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with files["trace"].open("a", encoding="utf-8") as trace:
        trace.write(LINE.format(batch=10, steps="lots", scale=1, arrival=500) + "\n")
    with pytest.raises(SystemExit) as exited:
        run(*base(files))
    assert exited.value.code == 2
    assert f"{files['trace']}:4: total_steps 'lots' is not int" in capsys.readouterr().err


def test_cluster_and_config_parsing(tmp_path: Path) -> None:
    assert parse_cluster("v100=8, p100=16,k80=0") == {"v100": 8, "p100": 16, "k80": 0}
    for bad in ("v100", "v100=8,v100=2", "=3", "v100=0"):
        with pytest.raises(InvalidRequest):
            parse_cluster(bad)
    flat = tmp_path / "tacc.json"
    flat.write_text(json.dumps({"future_rounds": 7, "lambda": 3.0}), encoding="utf-8")
    options = policy_options(str(flat), ["shockwave"])
    assert options == {"shockwave": {"config": str(flat)}}  # Shockwave's own file, as it is
    policy = build_policy("shockwave", options["shockwave"])
    assert isinstance(policy, ShockwavePolicy)
    assert (policy.config.future_rounds, policy.config.lam) == (7, 3.0)
    flat.write_text(json.dumps({"future_rounds": 7, "lambda_": 3.0}), encoding="utf-8")
    with pytest.raises(InvalidRequest, match="unknown Shockwave options"):
        build_policy("shockwave", policy_options(str(flat), ["shockwave"])["shockwave"])
    flat.write_text("{", encoding="utf-8")
    with pytest.raises(InvalidRequest, match="is not JSON"):
        policy_options(str(flat), [])


def test_the_app_is_a_subcommand() -> None:
    assert KernelfleetApp.subcommands["simulate-jobs"][0] == (
        f"{SimulateJobsApp.__module__}.{SimulateJobsApp.__name__}"
    )


def test_shockwave_s_conventions_charge_each_resumed_job(files: dict[str, Path]) -> None:
    """Three jobs on one GPU: someone waits and resumes, and under Shockwave's conventions every
    resume costs 20 s of training, so jobs finish later than under Gavel's."""
    argv = base(files, "--policy", "max_min_fairness", "--round-s", "60", cluster="fast=1")
    files["trace"].write_text(
        "\n".join(
            LINE.format(batch=10, steps=steps, scale=1, arrival=0) for steps in (4000, 3000, 2000)
        )
        + "\n",
        encoding="utf-8",
    )
    run(*argv)
    gavel = json.loads(files["json"].read_text())["policies"]["max_min_fairness"]
    run(*argv, "--conventions", "shockwave")
    shockwave = json.loads(files["json"].read_text())["policies"]["max_min_fairness"]
    assert shockwave["avg_jct_s"] > gavel["avg_jct_s"] + 20


README = Path(__file__).resolve().parents[3] / "README.md"
SHARED = README.parent.parent / "shared"


@pytest.mark.skipif(not (SHARED / "data" / "gavel").is_dir(), reason="../shared/data is absent")
def test_the_readme_s_command_runs_as_written_and_prints_what_it_says(tmp_path: Path) -> None:
    marker = "<!-- tested by tests/scheduler/jobs/test_simulate_jobs_app.py: simulate-jobs -->"
    text = README.read_text(encoding="utf-8")
    block = text[text.index(marker) :].split("```bash\n", 1)[1].split("\n```\n", 1)[0]
    clone = tmp_path / "clone"  # a clone's folder with ../shared beside it, as the README says
    clone.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)
    ran = subprocess.run(
        ["bash", "-c", block], cwd=clone, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    rows = {line.split()[0]: line.split() for line in ran.stdout.splitlines() if line.strip()}
    said = text[text.index(marker) :].split("It prints average JCTs of ", 1)[1]
    first, second = said.split(" h and ", 1)[0], said.split(" h and ", 1)[1].split(" h")[0]
    assert rows["max_min_fairness"][2] == first
    assert rows["max_min_fairness_perf"][2] == second
    assert json.loads((clone / "las.json").read_text())["policies"].keys() == {
        "max_min_fairness",
        "max_min_fairness_perf",
    }
