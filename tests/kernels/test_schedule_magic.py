"""``%schedule``: its arguments, the docs' example, what it does in an in-process IPython shell
without a gateway, and %fleet's lines about jobs. (Against a live gateway and real jobs:
tests/jobs/test_live.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import kernelfleet
from kernelfleet.client import NotAFleetKernel
from kernelfleet.kernels.magics import views
from kernelfleet.kernels.magics.parsing import parse
from kernelfleet.kernels.magics.schedule import ScheduleMagics, schedule_parser, split_script_args


@pytest.fixture
def shell(monkeypatch) -> InteractiveShell:
    for name in ("KERNELFLEET_GATEWAY_URL", "KERNELFLEET_KERNEL_TOKEN", "KERNELFLEET_KERNEL_ID"):
        monkeypatch.delenv(name, raising=False)
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("kernelfleet.kernels.magics")
    return shell


def test_submit_reads_its_options_and_the_scripts_argv_after_a_double_dash():
    own, argv = split_script_args("submit train.py --gpus 2 --steps 20000 -- --lr 0.1 -- x")
    args = parse(schedule_parser(), own)
    assert (args.command, args.script, args.gpus, args.steps) == ("submit", "train.py", 2, 20000)
    assert (args.name, args.weight) == (None, None)
    assert argv == ["--lr", "0.1", "--", "x"]
    named = parse(
        schedule_parser(), "submit 'my train.py' --gpus 1 --steps 5 --name a --weight 0.5"
    )
    assert (named.script, named.name, named.weight) == ("my train.py", "a", 0.5)
    assert split_script_args("status  # all of them") == ("status", [])


@pytest.mark.parametrize(
    ("line", "command", "values"),
    [
        ("", None, {}),
        ("status", "status", {"id": None}),
        ("status 1a2b", "status", {"id": "1a2b"}),
        ("cancel job-1a2b3c4d", "cancel", {"id": "job-1a2b3c4d"}),
        ("logs 1a --tail 50", "logs", {"id": "1a", "tail": 50}),
        ("logs 1a", "logs", {"tail": None}),
        ("policy", "policy", {"name": None}),
        ("policy max_min_fairness", "policy", {"name": "max_min_fairness"}),
        ("simulate", "simulate", {"policies": None}),
        (
            "simulate --policy fifo --policy shockwave",
            "simulate",
            {"policies": ["fifo", "shockwave"]},
        ),
    ],
)
def test_each_command_parses(line, command, values):
    args = parse(schedule_parser(), line)
    assert args.command == command
    for key, value in values.items():
        assert getattr(args, key) == value


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("submit train.py --steps 10", "the following arguments are required: --gpus"),
        ("submit train.py --gpus 2", "the following arguments are required: --steps"),
        ("submit train.py --gpus 0 --steps 10", "argument --gpus: expected a whole number from 1"),
        ("submit train.py --gpus two --steps 10", "argument --gpus: expected a whole number"),
        ("submit train.py --gpus 1 --steps 1.5", "argument --steps: expected a whole number"),
        (
            "submit train.py --gpus 1 --steps 9 --weight 0",
            "argument --weight: expected a number above 0",
        ),
        ("submit train.py --gpus 1 --steps 9 --weight nan", "expected a number above 0"),
        ("submit --gpus 1 --steps 9", "the following arguments are required: SCRIPT"),
        ("cancel", "the following arguments are required: ID"),
        ("logs 1a --tail 0", "argument --tail: expected a whole number from 1 to 10000"),
        ("bogus", "argument COMMAND: invalid choice: 'bogus'"),
        ("status 1 2", "unrecognized arguments: 2"),
    ],
)
def test_bad_arguments_are_one_usage_error(line, why):
    with pytest.raises(UsageError, match="usage: %schedule") as refused:
        parse(schedule_parser(), line)
    assert why in str(refused.value)


def test_in_a_shell_help_prints_and_bad_input_is_a_usage_error(shell, capsys):
    for line in ["%schedule --help", "%schedule submit -h"]:
        assert shell.run_cell(line).success, line
    out = capsys.readouterr().out
    assert "usage: %schedule [-h] COMMAND" in out
    assert "usage: %schedule submit [-h] --gpus N --steps N" in out
    for line in [
        "%schedule status -- x",  # only submit takes a script's argv
        "%schedule submit nowhere.py --gpus 1 --steps 1",
        "%schedule submit 'unclosed --gpus 1",
    ]:
        result = shell.run_cell(line)
        assert isinstance(result.error_in_exec, UsageError), line
    assert (
        "no script 'nowhere.py' (not a file, nor a function of this notebook)"
        in capsys.readouterr().err
    )


def test_outside_kernelfleet_the_commands_say_so_in_one_line(shell, tmp_path):
    (tmp_path / "train.py").write_text("pass\n")
    for line in ["%schedule", f"%schedule submit {tmp_path / 'train.py'} --gpus 1 --steps 1"]:
        result = shell.run_cell(line)
        assert isinstance(result.error_in_exec, NotAFleetKernel), line
        assert result.error_in_exec._render_traceback_() == [
            "NotAFleetKernel: this kernel is not run by kernelfleet (KERNELFLEET_GATEWAY_URL, "
            "KERNELFLEET_KERNEL_TOKEN, KERNELFLEET_KERNEL_ID not set)"
        ]


def test_a_script_name_is_a_file_or_a_function_of_the_notebook(shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "folder").mkdir()
    shell.run_cell("def fit():\n    return 1\nnot_callable = 3")
    magics = ScheduleMagics(shell)
    assert str(magics._target("train.py")) == "train.py"
    assert magics._target("fit")() == 1
    with pytest.raises(UsageError, match="folder is not a file"):
        magics._target("folder")
    with pytest.raises(UsageError, match="no script 'not_callable'"):
        magics._target("not_callable")
    refused = shell.run_cell("%schedule submit fit --gpus 1 --steps 1 -- x").error_in_exec
    assert isinstance(refused, UsageError)
    assert "fit is a function: it takes no arguments after --" in str(refused)


# ---- %fleet's lines about jobs -----------------------------------------------------------------


def test_fleet_policy_has_a_jobs_line_and_hosts_say_which_devices_are_lent():
    fleet = {"policy": "notebookos", "jobs": {"queued": 1, "running": 2, "gpus_lent": 3}}
    assert re.search(
        r"background jobs +1 queued, 2 running, 3 GPUs lent", repr(views.policy_view(fleet))
    )
    assert "background jobs" not in repr(views.policy_view({"policy": "notebookos"}))
    as_map = {
        "total": 4,
        "committed": 1,
        "lent_to_job": {"0": None, "1": "job-a", "2": "job-a", "3": "job-b"},
    }
    as_list = {
        "total": 2,
        "devices": [{"id": "0", "lent_to_job": None}, {"id": "1", "lent_to_job": "job-c"}],
    }
    none_lent = {"total": 1, "lent_to_job": {"0": None}}
    hosts = [
        {"id": "host-1", "state": "alive", "gpus": as_map},
        {"id": "host-2", "state": "alive", "gpus": as_list},
        {"id": "host-3", "state": "alive", "gpus": none_lent},
    ]
    lines = repr(views.hosts_view(hosts)).splitlines()
    assert lines[1].endswith("lent to jobs")
    assert lines[2].endswith("1, 2 → job-a; 3 → job-b")
    assert lines[3].endswith("1 → job-c")
    assert lines[4].endswith("-")
    older = [{"id": "host-1", "state": "alive", "gpus": {"total": 2, "devices": ["0", "1"]}}]
    assert "lent" not in repr(views.hosts_view(older))


def test_the_docs_worked_example_is_accepted_as_written():
    docs = (Path(kernelfleet.__file__).resolve().parent.parent / "docs" / "magics.md").read_text()
    lines = re.findall(r"^In:  %schedule ?(.*)$", docs, re.M)
    assert len(lines) >= 8
    for line in lines:
        own, _ = split_script_args(line)
        assert parse(schedule_parser(), own) is not None, line
