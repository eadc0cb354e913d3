"""``%pufferfish``: factorise a notebook model into low-rank layers (Pufferfish, MLSys'21).

::

    %pufferfish MODEL --rank-ratio R [--keep-full first,last|first:K|NAMES|none]
                      [--warmup-epochs E] [--optimizer OPT] [--dry-run]

MODEL and OPT are notebook variables. Without ``--warmup-epochs`` the model is factorised now,
in place: the variable keeps the same model object, whose layers are swapped (only a MODEL that is
itself one Linear or Conv2d is replaced, and the variable rebound); the magic returns the table
of layers, ranks, parameters and all-reduce bytes per DDP step, before and after. With
``--warmup-epochs E`` nothing changes yet: it prints the plan and returns a `Warmup` handle
(``pf = %pufferfish ...``); the training loop calls ``pf.epoch_end()`` after each epoch, and
the call that ends epoch E factorises with SVD initialisation from the trained weights.
``--optimizer OPT`` moves that optimizer onto the factors at the switch, in place (state kept
for every parameter that stays, dropped for the replaced weights: `warmup.move_optimizer`);
without it, build a new optimizer over ``model.parameters()`` after the switch. ``--dry-run``
shows the plan and changes nothing.

A thin shell over `factorize`, `warmup` and `report`. A rank ratio outside (0, 1], an unknown
variable or keep-full name raise ``UsageError`` in one line; a model with nothing to
factorise raises `NothingToFactorize`, saying why for each layer.
"""

from __future__ import annotations

import argparse
from functools import cached_property
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kernelfleet.kernels.magics.parsing import MagicParser, count_in, parse

# torch is imported when the magic runs, not when a kernel loads the magics
DEFAULT_KEEP_FULL = "first,last"


def load(ipython: Any) -> None:
    """The ``kernelfleet.magics`` entry point: register ``%pufferfish``."""
    ipython.register_magics(PufferfishMagics)


def pufferfish_parser() -> MagicParser:
    parser = MagicParser(
        prog="%pufferfish",
        description="Swap a model's Linear and Conv2d layers (and transformer FFNs) for "
        "low-rank factorised pairs, now or after full-rank warm-up epochs (Pufferfish).",
    )
    parser.add_argument("model", metavar="MODEL", help="a notebook variable: a torch module")
    parser.add_argument(
        "--rank-ratio",
        type=float,
        required=True,
        metavar="R",
        help="rank = ceil(R x full rank), 0 < R <= 1 (Pufferfish: 0.25)",
    )
    parser.add_argument(
        "--keep-full",
        default=DEFAULT_KEEP_FULL,
        metavar="SPEC",
        help="first, last, first:K, module names or none, comma-separated (default first,last)",
    )
    parser.add_argument(
        "--warmup-epochs",
        type=count_in(0, 1_000_000),
        default=0,
        metavar="E",
        help="full-rank epochs before the switch (default 0: now)",
    )
    parser.add_argument(
        "--optimizer", metavar="OPT", help="a notebook optimizer to move onto the factors"
    )
    parser.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    return parser


@magics_class
class PufferfishMagics(Magics):
    """``%pufferfish``: see the module docstring."""

    @cached_property
    def parser(self) -> MagicParser:
        return pufferfish_parser()

    @line_magic
    def pufferfish(self, line: str) -> Any:
        """Factorise a model into low-rank layers (``%pufferfish --help``)."""
        args = parse(self.parser, line)
        if args is None:
            return None
        import torch

        from kernelfleet.tools.pufferfish.layers import check_ratio

        try:
            check_ratio(args.rank_ratio)
        except ValueError as error:
            raise UsageError(str(error)) from None
        model = self._variable(args.model, torch.nn.Module, "a torch module")
        optimizer = None
        if args.optimizer:
            optimizer = self._variable(args.optimizer, torch.optim.Optimizer, "an optimizer")
        keep_full = args.keep_full.split(",")
        try:
            return self._run(args, model, optimizer, keep_full)
        except ValueError as error:
            raise UsageError(str(error).splitlines()[0]) from None

    def _run(
        self, args: argparse.Namespace, model: Any, optimizer: Any, keep_full: list[str]
    ) -> Any:
        from kernelfleet.tools.pufferfish.factorize import factorize, plan_factorization
        from kernelfleet.tools.pufferfish.report import plan_view
        from kernelfleet.tools.pufferfish.warmup import Warmup, move_optimizer

        if args.dry_run:
            plan = plan_factorization(model, args.rank_ratio, keep_full)
            return plan_view(plan, f"%pufferfish {args.model}: the plan (nothing changed)")
        if args.warmup_epochs:
            handle = Warmup(model, args.rank_ratio, args.warmup_epochs, keep_full, optimizer)
            title = (
                f"%pufferfish {args.model}: full rank for {args.warmup_epochs} epochs, "
                "then factorised at the end of the last one"
            )
            print(repr(plan_view(handle.plan, title)))
            print("call .epoch_end() after each epoch")
            return handle
        done = factorize(model, args.rank_ratio, keep_full)
        how = "factorised in place"
        if done.model is not model and self.shell is not None:
            self.shell.user_ns[args.model] = done.model
            how = "rebound to the factorised layer"
        if optimizer is not None:
            move_optimizer(optimizer, done.replaced)
            how += f"; {args.optimizer} moved onto the factors"
        return plan_view(done.plan, f"%pufferfish {args.model}: {how}")

    def _variable(self, name: str, kind: type, what: str) -> Any:
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name not in namespace:
            raise UsageError(f"{name} is not defined in the notebook")
        value = namespace[name]
        if not isinstance(value, kind):
            raise UsageError(f"{name} is a {type(value).__name__}, not {what}")
        return value
