"""``%checkfreq`` in an in-process IPython shell: arguments, the status view, and a resume in a
second shell that never ran ``%checkfreq on`` (a follower replica taking over)."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.kernels.magics import registry
from kernelfleet.protocol import ReplicaEnv
from kernelfleet.tools.checkfreq.magics import StatusView, default_directory

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

SETUP = "from tests.tools.checkfreq_setup import training_objects, train\n" \
    "globals().update(training_objects())"  # fmt: skip


def new_shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    registry.load_all(shell)  # what a kernel does at start: every registered magic
    return shell


@pytest.fixture
def shell() -> InteractiveShell:
    return new_shell()


def run(shell: InteractiveShell, code: str) -> object:
    result = shell.run_cell(code)
    if result.error_in_exec is not None:
        raise result.error_in_exec
    if result.error_before_exec is not None:
        raise result.error_before_exec
    return result.result


def test_the_registry_loads_checkfreq():
    assert registry.OWN["checkfreq"] == "kernelfleet.tools.checkfreq.magics:load"
    assert "checkfreq" in new_shell().magics_manager.magics["line"]


def test_help_and_bad_arguments(shell, capsys):
    assert shell.run_cell("%checkfreq --help").success
    assert shell.run_cell("%checkfreq on -h").success
    out = capsys.readouterr().out
    assert "usage: %checkfreq [-h] COMMAND" in out
    assert "--max-overhead PERCENT" in out
    for line in ["%checkfreq bogus", "%checkfreq on --max-overhead 0",
                 "%checkfreq on --max-overhead 100", "%checkfreq on --max-overhead x",
                 "%checkfreq off now", "%checkfreq on '"]:  # fmt: skip
        result = shell.run_cell(line)
        assert isinstance(result.error_in_exec, UsageError), line
    assert "usage: %checkfreq" in capsys.readouterr().err


def test_status_before_on_says_off(shell):
    view = run(shell, "%checkfreq")
    assert isinstance(view, StatusView)
    assert "off (never on in this kernel" in repr(view)
    assert "<table>" in view._repr_html_()


def test_resume_with_no_checkpoint_is_one_line(shell, tmp_path):
    with pytest.raises(UsageError, match=r"^no checkpoint to resume from in .*nothing$"):
        run(shell, f"%checkfreq resume --dir {tmp_path / 'nothing'}")


def test_on_status_off_then_resume_in_a_shell_that_never_ran_on(shell, tmp_path, capsys):
    folder = tmp_path / "ck"
    run(shell, SETUP)
    run(shell, f"%checkfreq on --max-overhead 10 --dir {folder}")
    assert f"checkfreq is on: checkpoints to {folder}, at most 10.0%" in capsys.readouterr().out
    first = run(shell, "train(globals(), 30)")
    view = run(shell, "%checkfreq status")
    text = repr(view)
    assert "state              on" in text
    assert "step               30" in text
    assert "(bound 10.0%)" in text
    assert "<td>newest checkpoint</td>" in view._repr_html_()
    run(shell, "%checkfreq off")  # waits for the checkpoint in flight, if any
    last = run(shell, "%checkfreq status").status.last_step
    assert last is not None
    assert f"checkfreq is off; the newest checkpoint: step {last}," in capsys.readouterr().out

    follower = new_shell()  # the setup cells ran here too (the replicated namespace)
    run(follower, SETUP.replace("training_objects()", "training_objects(seed=7)"))
    report = run(follower, f"%checkfreq resume --dir {folder}")
    assert repr(report).startswith(f"resumed at step {last} from {folder}")
    assert run(follower, "%checkfreq status").status.enabled  # on again, saved settings
    assert run(follower, "%checkfreq status").status.max_overhead == pytest.approx(0.10)
    assert run(follower, f"train(globals(), 30, start={last})") == first[last:]
    run(follower, "%checkfreq off")


def test_the_default_folder_is_the_kernels_object_store(monkeypatch, tmp_path):
    store = tmp_path / "kernel-k1"
    assert default_directory({ReplicaEnv.KERNEL_STORE: str(store)}) == (store / "checkfreq", "")
    monkeypatch.chdir(tmp_path)
    folder, note = default_directory({})
    assert folder == Path(tmp_path) / "checkfreq"
    assert "not in a fleet kernel" in note
