"""``%pufferfish`` in an in-process IPython shell: factorise a notebook model now or after a
warm-up, show the table, refuse bad input in one line. (In a live kernel of a fleet: the slow
test at the end.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.kernels.magics import registry
from kernelfleet.kernels.magics.views import View
from kernelfleet.tools.pufferfish.errors import NothingToFactorize
from kernelfleet.tools.pufferfish.layers import FactorizedConv2d, FactorizedLinear
from kernelfleet.tools.pufferfish.magics import load
from kernelfleet.tools.pufferfish.warmup import Warmup

MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, padding=1),
    torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
    torch.nn.Linear(64, 10),
)
batch = torch.randn(4, 3, 4, 4)
expected = model(batch)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
"""


@pytest.fixture
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    load(shell)
    assert shell.run_cell(MODEL).success
    return shell


def test_factorise_a_notebook_model_in_place(shell: InteractiveShell) -> None:
    model = shell.user_ns["model"]
    line = "model --rank-ratio 1.0 --keep-full none --optimizer opt"
    view = shell.run_line_magic("pufferfish", line)
    assert isinstance(view, View)
    assert shell.user_ns["model"] is model
    assert isinstance(model[0], FactorizedConv2d)
    assert isinstance(model[7], FactorizedLinear)
    torch.testing.assert_close(model(shell.user_ns["batch"]), shell.user_ns["expected"])
    moved = shell.user_ns["opt"].param_groups[0]["params"]
    assert [id(p) for p in moved] == [id(p) for p in model.parameters()]
    text = repr(view)
    assert "factorised in place; opt moved onto the factors" in text
    assert "rank ratio 1: 4 of 4 layers factorised" in text
    assert "Conv2d  32 x 16 x 3 x 3  32 of 32  4,640          5,664" in text
    assert "<table>" in view._repr_html_()


def test_a_quarter_with_the_default_keep_full(shell: InteractiveShell) -> None:
    text = repr(shell.run_line_magic("pufferfish", "model --rank-ratio 0.25"))
    assert "rank ratio 0.25: 2 of 4 layers factorised" in text
    assert "kept full: first" in text
    assert "kept full: last" in text
    assert "8 of 32" in text  # the second convolution: ceil(0.25 x min(32, 16 x 9))
    model = shell.user_ns["model"]
    assert isinstance(model[0], torch.nn.Conv2d)
    assert isinstance(model[2], FactorizedConv2d)


def test_warmup_returns_a_handle_that_switches_at_the_boundary(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = shell.run_line_magic(
        "pufferfish", "model --rank-ratio 0.5 --warmup-epochs 2 --optimizer opt"
    )
    assert isinstance(handle, Warmup)
    assert "full rank for 2 epochs" in capsys.readouterr().out
    model = shell.user_ns["model"]
    assert isinstance(model[2], torch.nn.Conv2d)
    assert handle.epoch_end() is None
    assert handle.epoch_end() is not None
    assert isinstance(model[2], FactorizedConv2d)
    assert any(p is model[2].v.weight for p in shell.user_ns["opt"].param_groups[0]["params"])


def test_dry_run_changes_nothing_and_a_lone_layer_is_rebound(shell: InteractiveShell) -> None:
    text = repr(shell.run_line_magic("pufferfish", "model --rank-ratio 0.25 --dry-run"))
    assert "the plan (nothing changed)" in text
    assert isinstance(shell.user_ns["model"][2], torch.nn.Conv2d)
    shell.user_ns["head"] = torch.nn.Linear(20, 30)
    view = shell.run_line_magic("pufferfish", "head --rank-ratio 0.5 --keep-full none")
    assert "%pufferfish head: rebound to the factorised layer" in repr(view)
    assert isinstance(shell.user_ns["head"], FactorizedLinear)
    assert shell.user_ns["head"].rank == 10


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("model --rank-ratio 0", "the rank ratio must be in (0, 1], got 0.0"),
        ("model --rank-ratio 1.5", "the rank ratio must be in (0, 1], got 1.5"),
        ("model --rank-ratio -1", "the rank ratio must be in (0, 1], got -1.0"),
        ("model --rank-ratio nan", "the rank ratio must be in (0, 1], got nan"),
        ("model --rank-ratio x", "argument --rank-ratio: invalid float value: 'x'"),
        ("model", "the following arguments are required: --rank-ratio"),
        ("nothing --rank-ratio 0.5", "nothing is not defined in the notebook"),
        ("batch --rank-ratio 0.5", "batch is a Tensor, not a torch module"),
        ("model --rank-ratio 0.5 --optimizer batch", "batch is a Tensor, not an optimizer"),
        ("model --rank-ratio 0.5 --keep-full 9", "keep-full 9: no such layer"),
        ("model --rank-ratio 0.5 --keep-full first:x", "expected first:K"),
        ("model --rank-ratio 0.5 --warmup-epochs -1", "argument --warmup-epochs"),
    ],
)
def test_bad_input_is_one_usage_line(shell: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("pufferfish", line)
    assert str(raised.value).startswith(message) or message in str(raised.value).splitlines()[0]
    assert isinstance(shell.user_ns["model"][2], torch.nn.Conv2d)  # nothing changed


def test_nothing_to_factorise_says_why(shell: InteractiveShell) -> None:
    shell.user_ns["norm"] = torch.nn.Sequential(torch.nn.LayerNorm(4))
    with pytest.raises(NothingToFactorize, match="has no Linear or Conv2d layer"):
        shell.run_line_magic("pufferfish", "norm --rank-ratio 0.5")
    error = NothingToFactorize("nothing to factorise: x")
    assert error._render_traceback_() == ["NothingToFactorize: nothing to factorise: x"]


def test_help_prints_and_returns_nothing(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shell.run_line_magic("pufferfish", "--help") is None
    assert "usage: %pufferfish" in capsys.readouterr().out


def test_registered_as_kernelfleets_own_magic() -> None:
    assert registry.OWN["pufferfish"] == "kernelfleet.tools.pufferfish.magics:load"


# ---- live: a kernel of a real fleet ------------------------------------------------------------


def result_text(reply: Any) -> str:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return str(results[-1]["content"]["data"]["text/plain"])


@pytest.mark.slow
async def test_pufferfish_magic_in_a_fleet_kernel(fleet: Any) -> None:
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(MODEL)
        assert setup.reply["status"] == "ok", setup.reply
        done = await client.execute("%pufferfish model --rank-ratio 1.0 --keep-full none")
        assert "4 of 4 layers factorised" in result_text(done)
        check = await client.execute(
            "torch.testing.assert_close(model(batch), expected); type(model[0]).__name__"
        )
        assert result_text(check) == "'FactorizedConv2d'"
        bad = await client.execute("%pufferfish model --rank-ratio 2")
        assert bad.reply["ename"] == "UsageError"
        assert bad.reply["evalue"] == "the rank ratio must be in (0, 1], got 2.0"
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
