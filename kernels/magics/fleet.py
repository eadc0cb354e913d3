"""``%fleet``: this kernel and its fleet, as the gateway sees them.

::

    %fleet                   this kernel: replicas, hosts, states, executor, GPUs, last cells
    %fleet hosts             every host's state and GPUs, and those lent to background jobs
    %fleet policy            the scheduling policy, replicas per kernel, background jobs,
                             the autoscaler
    %fleet migrate [--host ID]   move this kernel's executor replica (the policy picks a host)
    %fleet events [-n N]     this kernel's last N events (20; at most 1000)
    %fleet tools             the magics and panel sections installed, and their status

Each returns a `kernelfleet.kernels.magics.views.View` (rich HTML, plain-text repr), except
``migrate``, which prints what moved. ``--help`` works on each; bad arguments raise
``UsageError`` with the usage. Outside a kernelfleet kernel every command but ``tools`` raises
`kernelfleet.client.NotAFleetKernel`; an unreachable gateway raises ``GatewayUnreachable``
naming its URL.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.kernels.magics.parsing import MagicParser, count_in, parse

MAX_EVENTS = 1000


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%fleet``."""
    ipython.register_magics(FleetMagics)


def fleet_parser() -> MagicParser:
    parser = MagicParser(
        prog="%fleet",
        description="This kernel as the kernelfleet gateway runs it: its replicas, their "
        "hosts and states, the executor, GPUs bound, and its last cells' start delays.",
    )
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    commands.add_parser(
        "hosts",
        help="every host's state and GPUs",
        description="Every host's state and GPUs: committed now, subscribed, total, lent to "
        "background jobs.",
    )
    commands.add_parser(
        "policy",
        help="the scheduling policy and the autoscaler",
        description="The gateway's scheduling policy, replicas per kernel, the fleet's GPUs, "
        "background jobs (queued, running, GPUs lent), and the autoscaler's limits and last "
        "decision.",
    )
    migrate = commands.add_parser(
        "migrate",
        help="move this kernel's executor replica",
        description="Move this kernel's executor replica (the one that ran its last cell) to "
        "another host, its state kept; without --host the policy picks the host.",
    )
    migrate.add_argument("--host", metavar="ID", help="the host to move to (see %%fleet hosts)")
    events = commands.add_parser(
        "events", help="this kernel's last events", description="This kernel's last events, "
        "oldest first: cells queued, started and finished, GPUs, replicas."
    )  # fmt: skip
    events.add_argument(
        "-n",
        type=count_in(1, MAX_EVENTS),
        default=20,
        metavar="N",
        help=f"how many (default 20, at most {MAX_EVENTS})",
    )
    commands.add_parser(
        "tools",
        help="the magics and panel sections installed",
        description="Every entry point of the kernelfleet.magics and kernelfleet.panel_sections "
        "groups, and whether its magic loaded in this kernel.",
    )
    return parser


@magics_class
class FleetMagics(Magics):
    """``%fleet``; `client_factory` makes the `FleetClient` each command uses (the kernel's
    own, from its environment, by default)."""

    def __init__(self, shell: Any = None, client_factory: Callable[[], Any] | None = None):
        super().__init__(shell)
        self.client_factory = client_factory

    @cached_property
    def parser(self) -> MagicParser:
        return fleet_parser()  # on first use: the kernel starts without building it

    def client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory()
        from kernelfleet.client import FleetClient

        return FleetClient.from_environment()

    @line_magic
    def fleet(self, line: str) -> Any:
        """This kernel and its fleet, as the kernelfleet gateway sees them (``%fleet --help``)."""
        args = parse(self.parser, line)
        if args is None:
            return None
        from kernelfleet.kernels.magics import registry, views

        if args.command == "tools":
            return views.tools_view(registry.installed(self.shell))
        client = self.client()
        if args.command is None:
            return views.kernel_view(client.kernel())
        if args.command == "hosts":
            return views.hosts_view(client.hosts())
        if args.command == "policy":
            return views.policy_view(client.fleet())
        if args.command == "events":
            return views.events_view(client.events(args.n))
        moved = client.migrate(args.host)
        if moved.get("state") == "scheduled":
            to = moved.get("to_host") or "a host the policy picks"
            print(
                f"this kernel's executor moves from {moved.get('from_host')} to {to} once this "
                "cell ends (its state goes with it; %fleet shows where it is)"
            )
        else:
            print(
                f"moved this kernel's executor from {moved.get('from_host')} to "
                f"{moved.get('to_host')} (now replica {moved.get('replica_id')})"
            )
        return None
