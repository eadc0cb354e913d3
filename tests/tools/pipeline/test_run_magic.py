"""``%pipeline run``: what it refuses in an in-process shell (no worker starts), how a plan's
stages become a run's, the report's text, and one real run in a live kernel of a fleet, which
trains the notebook's model exactly as one process would and leaves the weights in it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.magics import PipelineMagics, load, run_table
from kernelfleet.tools.pipeline.planner import Plan, Stage
from kernelfleet.tools.pipeline.runner import RunResult
from kernelfleet.tools.pipeline.stages import (
    StageSplit,
    parse_ranges,
    parse_stages,
    stage_ranges,
    without_replicas,
)

NOTEBOOK = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
    torch.nn.Linear(16, 4),
)
x, y = torch.randn(12, 8), torch.randn(12, 4)
"""


@pytest.fixture
def shell() -> InteractiveShell:
    pytest.importorskip("torch")
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    load(shell)
    assert shell.run_cell(NOTEBOOK).success
    return shell


def plan_of(*stages: tuple[int, int, int]) -> Plan:
    """A plan with these ``(first, last, replicas)`` stages (the figures do not matter here)."""
    return Plan(
        stages=tuple(Stage(first, last, r, 1.0, 0.0, 0.0, 0.0) for first, last, r in stages),
        workers=sum(r for _, _, r in stages),
        bandwidth=1e9,
        time_per_minibatch_s=1.0,
        data_parallel_time_s=1.0,
        one_worker_time_s=1.0,
    )


RUN = "run model x y --loss mse --microbatches 2 "


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (RUN + "--schedule gpipe", "plan first (%pipeline plan ...), or give --plan or --stages"),
        (RUN + "--schedule zb --stages 0-4", "argument --schedule: invalid choice: 'zb'"),
        (RUN + "--schedule gpipe --plan nothing", "nothing is not defined in the notebook"),
        (RUN + "--schedule gpipe --plan x", "--plan x: not a plan"),
        (RUN + "--schedule gpipe --plan p --stages 0-4", "not allowed with argument --plan"),
        (RUN + "--schedule gpipe --stages 0-1,2-9", "cover layers 0-9 but the model has 5"),
        (RUN + "--schedule gpipe --stages 0-1,x", "bad stages '0-1,x'"),
        (RUN + "--schedule gpipe --stages 0-1x0,2-4", "bad stages '0-1x0,2-4'"),
        (RUN + "--schedule gpipe --stages 0-1x2,2-4 --workers 2", "3 replicas in all (x2,x1)"),
        (RUN + "--schedule interleaved --stages 0-1x2,2-4", "run with gpipe or 1f1b"),
        # --no-replicas: the stages run once each, so two stages on one worker are refused
        (RUN + "--schedule gpipe --stages 0-1x2,2-4 --no-replicas --workers 1", "only 1 work"),
        (RUN + "--schedule gpipe --stages 0,1,2-4 --workers 2", "3 stages but only 2 workers"),
        (RUN + "--schedule interleaved --stages 0-1,2-4 --workers 2", "2 stages per worker"),
        ("run model x y --loss mse --schedule gpipe --microbatches 5 --stages 0-1,2-4", "5 micro"),
        (RUN + "--schedule gpipe --stages 0-4 --hosts moon", "--hosts: invalid choice: 'moon'"),
        (RUN + "--schedule gpipe --stages 0-4 --loss nope", "nope is not defined"),
        (RUN + "--schedule gpipe --stages 0-4 --loss x", "--loss x: not mse, cross_entropy"),
        ("run model x --loss mse --schedule gpipe --microbatches 2", "required: targets"),
    ],
)
def test_bad_runs_are_one_line_usage_errors(
    shell: InteractiveShell, line: str, message: str
) -> None:
    shell.user_ns["p"] = shell.run_line_magic  # any notebook value that is not a plan
    with pytest.raises(UsageError, match=re.escape(message)):
        shell.run_line_magic("pipeline", line)


def test_the_last_plan_is_the_default(shell: InteractiveShell) -> None:
    magics = shell.magics_manager.registry["PipelineMagics"]
    assert isinstance(magics, PipelineMagics)
    magics.last_plan = plan_of((0, 1, 1), (2, 3, 1), (4, 4, 1))
    # the plan's three stages on two workers: refused before any worker starts
    with pytest.raises(UsageError, match="the plan has 3 stages but only 2 workers"):
        shell.run_line_magic("pipeline", RUN + "--schedule 1f1b --workers 2")


def test_a_replicated_plan_runs_its_replicas_unless_told_not_to(shell: InteractiveShell) -> None:
    split = stage_ranges(plan_of((0, 14, 3), (15, 39, 1)))
    assert split == StageSplit(((0, 14), (15, 39)), (3, 1))
    assert without_replicas(split) == StageSplit(
        ((0, 14), (15, 39)),
        (1, 1),
        ("replicas not run (--no-replicas): stage 0 (layers 0-14) x3; each stage runs once",),
    )
    assert without_replicas(StageSplit(((0, 3),), (1,))).notes == ()
    magics = shell.magics_manager.registry["PipelineMagics"]
    assert isinstance(magics, PipelineMagics)
    magics.last_plan = plan_of((0, 1, 2), (2, 4, 1))
    with pytest.raises(UsageError, match=re.escape("they need 3 workers, one per replica, not 2")):
        shell.run_line_magic("pipeline", RUN + "--schedule gpipe --workers 2")


def test_stage_ranges_from_text() -> None:
    assert parse_ranges("0-2, 3,4-6") == ((0, 2), (3, 3), (4, 6))
    assert parse_stages("0-2x2, 3,4-6x3") == StageSplit(((0, 2), (3, 3), (4, 6)), (2, 1, 3))
    with pytest.raises(InvalidRequest, match="replicas are not taken here"):
        parse_ranges("0-2x2,3")


def test_run_report_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = RunResult(
        schedule="interleaved",
        ranks=2,
        microbatches=4,
        ranges=((0, 1), (2, 3), (4, 5), (6, 6)),
        batch_size=16,
        losses=(1.5, 1.25),
        step_seconds=(0.5, 0.25),
        notes=("replicas not run (--no-replicas): ...",),
    )
    assert run_table(result).splitlines() == [
        "note: replicas not run (--no-replicas): ...",
        "interleaved on 2 workers (CPU, gloo): 4 microbatches of 4 samples, 2 steps",
        "stage  layers   replicas  workers",
        "    0  0-1             1  0",
        "    1  2-3             1  1",
        "    2  4-5             1  0",
        "    3  6-6             1  1",
        " step          loss   seconds",
        "    1           1.5    0.5000",
        "    2          1.25    0.2500",
        "64.0 samples/s (after the first step); the model holds the trained weights",
    ]


def test_replicated_run_report_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = RunResult(
        schedule="1f1b",
        ranks=4,
        microbatches=3,
        ranges=((0, 14), (15, 39)),
        batch_size=12,
        losses=(2.0,),
        step_seconds=(0.5,),
        placement=((0, 1, 2), (3,)),
    )
    assert run_table(result).splitlines()[:5] == [
        "1f1b on 4 workers (CPU, gloo): 3 microbatches of 4 samples, 1 steps",
        "the replicas of each stage sum their gradients before every SGD step",
        "stage  layers   replicas  workers",
        "    0  0-14            3  0,1,2",
        "    1  15-39           1  3",
    ]


# ---- live: a kernel of a real fleet ------------------------------------------------------------

CHECK = """
import torch
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
reference_losses = []
for _ in range(3):
    reference_optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(reference(x), y)
    loss.backward()
    reference_optimizer.step()
    reference_losses.append(loss.item())
torch.testing.assert_close(list(report.run.losses), reference_losses)
torch.testing.assert_close(dict(model.state_dict()), dict(reference.state_dict()))
print("trained as one process", len(report.run.ranges), "stages")
"""


def result_text(reply: Any) -> str:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return str(results[-1]["content"]["data"]["text/plain"])


WORKERS_S = 90
"""A cell that starts workers (Pythons importing torch) may take this long on a loaded host."""


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_pipeline_run_in_a_fleet_kernel(fleet: Any) -> None:
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(NOTEBOOK + "import copy\nreference = copy.deepcopy(model)\n")
        assert setup.reply["status"] == "ok", setup.reply
        planned = await client.execute(
            "%pipeline profile model x --repeats 1\n%pipeline plan --workers 2 --bandwidth 1e9"
        )
        assert "speed-up" in result_text(planned)
        run = await client.execute(
            "report = %pipeline run model x y --loss mse --schedule gpipe --microbatches 2 "
            "--steps 3 --lr 0.1\nreport",
            timeout=WORKERS_S,
        )
        assert run.reply["status"] == "ok", run.reply
        text = result_text(run)
        assert "gpipe on " in text
        assert "the model holds the trained weights" in text
        checked = await client.execute(CHECK)
        assert checked.reply["status"] == "ok", checked.reply
        assert "trained as one process" in "".join(
            m["content"]["text"] for m in checked.of_type("stream")
        )
        # a replicated stage: two workers share stage 0's microbatches
        replicated = await client.execute(
            "model = copy.deepcopy(reference)\n"
            "report = %pipeline run model x y --loss mse --schedule 1f1b --microbatches 3 "
            "--stages 0-1x2,2-4 --steps 3 --lr 0.1\n" + CHECK,
            timeout=WORKERS_S,
        )
        assert replicated.reply["status"] == "ok", replicated.reply
        assert "trained as one process 2 stages" in "".join(
            m["content"]["text"] for m in replicated.of_type("stream")
        )
        refused = await client.execute(
            "%pipeline " + RUN + "--schedule gpipe --stages 0-1,2-4 --microbatches 5"
        )
        assert refused.reply["ename"] == "UsageError"
        assert "5 microbatches do not divide the batch of 12 samples" in refused.reply["evalue"]
        # a loss defined in the notebook travels to the worker, and its error comes back
        failing = await client.execute(
            "def bad_loss(output, target):\n    raise ValueError('no loss today')\n"
            "%pipeline run model x y --loss bad_loss --schedule gpipe --microbatches 2 "
            "--stages 0-4",
            timeout=WORKERS_S,
        )
        assert failing.reply["ename"] == "WorkerFailed"
        assert failing.reply["evalue"].startswith("worker 0 failed:\nTraceback")
        assert "ValueError: no loss today" in failing.reply["evalue"]
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
