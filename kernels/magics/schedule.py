"""``%schedule``: background training jobs on the fleet's idle GPUs, from a notebook.

::

    %schedule submit SCRIPT --gpus N --steps N [--name NAME] [--weight W] [-- ARGS...]
    %schedule [status [ID]]      every job (state, GPUs, progress, throughput, lease,
                                 preemptions; a failed job's log tail), or one job
    %schedule cancel ID          cancel one of this kernel's jobs
    %schedule logs ID [--tail N] the job's last output lines
    %schedule policy [NAME]      the job policy (and those available); NAME sets it
    %schedule simulate [--policy NAME ...]   what-if of the current queue

A thin shell over `kernelfleet.jobs.JobsClient`: parse, call, show the record it returns.
``SCRIPT`` is a file's path, or the name of a function of no arguments defined in the notebook
(it is pickled and sent). Ids may be shortened while one job matches. Bad arguments raise
``UsageError`` with the usage; the gateway's refusals (an unknown id, another kernel's job, more
GPUs than any host has) raise `kernelfleet.client.FleetApiError`, shown as one line.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.kernels.magics.parsing import MagicParser, count_in, parse

MAX_GPUS = 4096
MAX_STEPS = 10**15
MAX_LOG_LINES = 10_000


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%schedule``."""
    ipython.register_magics(ScheduleMagics)


def positive_number(text: str) -> float:
    """An argparse ``type``: a number above 0 (a job's weight)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("expected a number above 0")
    return value


def schedule_parser() -> MagicParser:
    parser = MagicParser(
        prog="%schedule",
        description="Background training jobs on the fleet's idle GPUs: submit a script, "
        "watch its progress, cancel it; the job policy and a what-if of the queue.",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    submit = commands.add_parser(
        "submit",
        help="queue a script (or a notebook function) as a job",
        description="Queue SCRIPT as a job: a file's path (its text is sent, ARGS after -- "
        "are its argv), or the name of a function of no arguments defined in this notebook.",
    )
    submit.add_argument("script", metavar="SCRIPT", help="a script's path, or a function's name")
    submit.add_argument("--gpus", type=count_in(1, MAX_GPUS), required=True, metavar="N",
                        help="GPUs the job runs on")  # fmt: skip
    submit.add_argument("--steps", type=count_in(1, MAX_STEPS), required=True, metavar="N",
                        help="the job's step budget")  # fmt: skip
    submit.add_argument("--name", help="a name to know it by (default: the script's stem)")
    submit.add_argument("--weight", type=positive_number, metavar="W",
                        help="its priority weight (default 1)")  # fmt: skip
    status = commands.add_parser(
        "status",
        help="every job, or one",
        description="Every job: state, GPUs, progress, throughput, lease, preemptions, and "
        "a failed job's log tail; with ID, that job's record.",
    )
    status.add_argument("id", nargs="?", metavar="ID", help="a job id (may be shortened)")
    cancel = commands.add_parser(
        "cancel", help="cancel one of this kernel's jobs", description="Cancel a job this "
        "kernel submitted: a running one is asked to stop, then killed after the grace period."
    )  # fmt: skip
    cancel.add_argument("id", metavar="ID", help="a job id (may be shortened)")
    logs = commands.add_parser(
        "logs", help="a job's last output lines", description="The last lines a job's "
        "process wrote to stdout and stderr."
    )  # fmt: skip
    logs.add_argument("id", metavar="ID", help="a job id (may be shortened)")
    logs.add_argument("--tail", type=count_in(1, MAX_LOG_LINES), metavar="N",
                      help=f"only the last N lines (at most {MAX_LOG_LINES})")  # fmt: skip
    policy = commands.add_parser(
        "policy",
        help="the job policy; NAME sets it",
        description="The policy that shares the GPUs lent to jobs, and those available; "
        "with NAME, make it the policy.",
    )
    policy.add_argument("name", nargs="?", metavar="NAME", help="a policy to switch to")
    simulate = commands.add_parser(
        "simulate",
        help="what-if of the current queue",
        description="Replay the current queue with the job simulator under each policy "
        "(every --policy given, else the gateway's choice): average JCT, makespan, "
        "utilisation, finish-time fairness.",
    )
    simulate.add_argument("--policy", action="append", dest="policies", metavar="NAME",
                          help="a policy to simulate (repeat for several)")  # fmt: skip
    return parser


def split_script_args(line: str) -> tuple[str, list[str]]:
    """`line` cut at its first ``--`` word: the magic's own arguments, and the script's argv
    after it (empty without one). Raises ``UsageError`` for unbalanced quotes."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise UsageError(f"{e}\nusage: %schedule COMMAND ...  (%schedule --help)") from None
    if "--" not in words:
        return shlex.join(words), []
    cut = words.index("--")
    return shlex.join(words[:cut]), words[cut + 1 :]


@magics_class
class ScheduleMagics(Magics):
    """``%schedule``; `client_factory` makes the `kernelfleet.jobs.JobsClient` each command
    uses (the kernel's own, from its environment, by default)."""

    def __init__(self, shell: Any = None, client_factory: Callable[[], Any] | None = None):
        super().__init__(shell)
        self.client_factory = client_factory

    @cached_property
    def parser(self) -> MagicParser:
        return schedule_parser()  # on first use: the kernel starts without building it

    def client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory()
        from kernelfleet.jobs import JobsClient

        return JobsClient.from_environment()

    @line_magic
    def schedule(self, line: str) -> Any:
        """Background jobs on the fleet's idle GPUs (``%schedule --help``)."""
        own, script_args = split_script_args(line)
        args = parse(self.parser, own)
        if args is None:
            return None
        if script_args and args.command != "submit":
            raise UsageError("only submit takes a script's arguments after --")
        if args.command == "submit":
            self._submit(args, script_args)
            return None
        client = self.client()
        if args.command in (None, "status"):
            return client.job(args.id) if getattr(args, "id", None) else client.status()
        if args.command == "logs":
            return client.logs(args.id, args.tail)
        if args.command == "simulate":
            return client.simulate(args.policies)
        if args.command == "policy":
            shown = client.policy(args.name)
            if args.name is not None:
                print(f"the job policy is now {shown.policy}")
            return shown
        job = client.cancel(args.id)
        print(f"cancelled {job.id} ({job.name}) at {job.steps_done} of {job.steps} steps")
        return None

    def _submit(self, args: argparse.Namespace, script_args: list[str]) -> None:
        target = self._target(args.script)
        if callable(target) and script_args:
            raise UsageError(f"{args.script} is a function: it takes no arguments after --")
        job = self.client().submit(
            target,
            gpus=args.gpus,
            steps=args.steps,
            name=args.name,
            weight=args.weight,
            args=script_args,
        )
        gpus = f"{job.gpus} GPU{'' if job.gpus == 1 else 's'}"
        steps = f"{job.steps} step{'' if job.steps == 1 else 's'}"
        print(
            f"submitted {job.id} ({job.name}): {gpus}, {steps}, {job.state} "
            f"(%schedule status {job.id} follows it)"
        )

    def _target(self, script: str) -> Any:
        """A script file's path, or the notebook's function of that name."""
        path = Path(script).expanduser()
        if path.is_file():
            return path
        user_ns = getattr(self.shell, "user_ns", None) or {}
        function = user_ns.get(script)
        if callable(function):
            return function
        if path.exists():
            raise UsageError(f"{script} is not a file")
        raise UsageError(f"no script {script!r} (not a file, nor a function of this notebook)")
