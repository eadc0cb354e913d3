"""``%pipeline`` in an in-process IPython shell: profile a torch model of the notebook, plan it,
read a graph.txt, and refuse bad input with ``UsageError``. (In a live kernel of a fleet:
the slow test at the end.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.kernels.magics import registry
from kernelfleet.tools.pipeline.magics import Report, load
from kernelfleet.tools.pipeline.planner import Plan
from kernelfleet.tools.pipeline.profiles import ModelProfile

MODEL = """
import torch
model = torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(inplace=True), torch.nn.Linear(64, 64),
    torch.nn.ReLU(), torch.nn.Linear(64, 10),
)
batch = torch.randn(16, 32)
"""


@pytest.fixture
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    load(shell)
    return shell


def test_profile_then_plan_a_notebook_model(shell: InteractiveShell) -> None:
    pytest.importorskip("torch")
    assert shell.run_cell(MODEL).success
    report = shell.run_line_magic("pipeline", "profile model batch --repeats 1 --warmup 0")
    assert isinstance(report, Report)
    assert len(report.profile) == 5
    assert report.profile.layers[0].parameter_bytes == (32 * 64 + 64) * 4
    assert "5 layers:" in repr(report)
    assert "Linear(in_features=32, out_features=64" in repr(report)
    plan = shell.run_line_magic("pipeline", "plan --workers 3 --bandwidth 1e9")
    assert isinstance(plan.plan, Plan)
    assert sum(stage.replicas for stage in plan.plan.stages) == 3
    assert "speed-up" in repr(plan)
    assert "[stage 0: layers 0-" in repr(plan)
    assert plan._repr_html_().startswith("<pre>")


def test_plan_a_graph_profile_by_path_or_variable(
    shell: InteractiveShell, pipedream_profile: Callable[[str], Path]
) -> None:
    path = str(pipedream_profile("vgg16"))
    by_path = shell.run_line_magic(
        "pipeline", f"plan --profile {path} --workers 4 --bandwidth 1.25e9"
    )
    assert re.search(r"speed-up 2\.87x over 4-way data parallelism", repr(by_path))
    shell.user_ns["vgg"] = shell.run_line_magic("pipeline", f"profile --graph {path}")
    assert isinstance(shell.user_ns["vgg"].profile, ModelProfile)
    levels = shell.run_line_magic("pipeline", "plan --profile vgg --levels 4:1e10,2:1.25e9")
    assert [s.replicas for s in levels.plan.stages] == [4, 2, 1, 1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "the following arguments are required: command"),
        ("plan --workers 2 --bandwidth 1e9", "profile a model first"),
        ("profile", "give the notebook's MODEL and SAMPLE"),
        ("profile nothing here", "nothing is not defined"),
        ("profile m s --graph g.txt", "not both"),
        ("profile --graph /no/such/graph.txt", "no profile at /no/such/graph.txt"),
        ("plan --profile nope --workers 2 --bandwidth 1", "neither a profile"),
        ("profile m s --repeats 0", "expected a whole number from 1"),
        ("plan 'unclosed", "No closing quotation"),
    ],
)
def test_bad_input_raises_usage_error(shell: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        shell.run_line_magic("pipeline", line)


def test_planner_refusals_are_usage_errors(
    shell: InteractiveShell, pipedream_profile: Callable[[str], Path]
) -> None:
    path = str(pipedream_profile("vgg16"))
    shell.run_line_magic("pipeline", f"profile --graph {path}")
    for line, message in [
        ("plan --workers 4 --bandwidth 1e9 --memory 1e8", "alone holds"),
        ("plan --workers 4", "give --workers N and --bandwidth"),
        ("plan --workers 4 --bandwidth inf", "bandwidth must be a positive"),
        ("plan --levels 4:1e10 --workers 2", "give --levels alone"),
        ("plan --levels x", "bad --levels"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            shell.run_line_magic("pipeline", line)


def test_help_prints_and_returns_nothing(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shell.run_line_magic("pipeline", "plan --help") is None
    assert "usage: %pipeline plan" in capsys.readouterr().out


def test_registered_as_kernelfleets_own_magic() -> None:
    assert registry.OWN["pipeline"] == "kernelfleet.tools.pipeline.magics:load"


# ---- live: a kernel of a real fleet ------------------------------------------------------------


def result_text(reply: Any) -> str:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return results[-1]["content"]["data"]["text/plain"]


@pytest.mark.slow
async def test_pipeline_magic_in_a_fleet_kernel(
    fleet: Any, pipedream_profile: Callable[[str], Path]
) -> None:
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(MODEL)
        assert setup.reply["status"] == "ok", setup.reply
        profiled = await client.execute("%pipeline profile model batch --repeats 1")
        assert "5 layers:" in result_text(profiled)
        planned = await client.execute("%pipeline plan --workers 2 --bandwidth 1e9")
        assert "speed-up" in result_text(planned)
        graph = await client.execute(
            f"%pipeline plan --profile {pipedream_profile('vgg16')} --workers 4 --bandwidth 1.25e9"
        )
        assert "speed-up 2.87x over 4-way data parallelism" in result_text(graph)
        bad = await client.execute("%pipeline plan --workers 4 --bandwidth 1e9 --memory 1")
        assert bad.reply["ename"] == "UsageError"
        assert "alone holds" in bad.reply["evalue"]
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
