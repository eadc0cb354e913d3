"""Pufferfish's full-rank warm-up: train E epochs at full rank, then factorise with SVD
initialisation at the boundary and go on training the factors.

`Warmup` is the handle a training loop holds. It counts epochs: the loop calls `epoch_end()`
after each one, and the call that ends epoch E factorises the model in place
(`factorize.factorize`) and moves the optimizer it was given onto the new parameters
(`move_optimizer`). Later calls do nothing. A model wrapped in DistributedDataParallel must be
wrapped again after the switch (its buckets hold the old parameters): give `Warmup` the inner
module and wrap ``warmup.model`` anew when `epoch_end` returns a `Factorization`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kernelfleet.tools.pufferfish.factorize import (
    DEFAULT_KEEP_FULL,
    Factorization,
    FactorizationPlan,
    factorize,
    plan_factorization,
)


def move_optimizer(
    optimizer: torch.optim.Optimizer, replaced: dict[torch.Tensor, tuple[torch.Tensor, ...]]
) -> None:
    """Point `optimizer` at the factorised model, in place (so an LR scheduler holding it goes
    on working): in each parameter group, a replaced weight gives way to its factors, in the
    same place and with the group's hyper-parameters. The state of every parameter that is
    still there (biases, which the factorised layers keep, norms, layers kept full) is kept;
    the replaced weights' state (momentum, Adam's moments) is dropped, because the moments of W
    say nothing about those of U and V: the factors start with empty state, as a freshly built
    optimizer would give them."""
    for group in optimizer.param_groups:
        params: list[torch.Tensor] = []
        for param in group["params"]:
            params.extend(replaced.get(param, (param,)))
        group["params"] = params
    for weight in replaced:
        optimizer.state.pop(weight, None)


class Warmup:
    """Full rank for `epochs` epochs, then factorised at `ratio` (see the module docstring).
    The plan is made now, so a bad ratio, keep-full name or a model with nothing to factorise
    is refused before any training."""

    def __init__(
        self,
        model: nn.Module,
        ratio: float,
        epochs: int,
        keep_full: Sequence[str] = DEFAULT_KEEP_FULL,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"warm-up epochs must be 1 or more, got {epochs}")
        self.plan: FactorizationPlan = plan_factorization(model, ratio, keep_full)
        if not self.plan.factorized:
            factorize(model, ratio, keep_full)  # raises NothingToFactorize with the reasons
        self.model, self.ratio, self.epochs = model, ratio, epochs
        self.keep_full, self.optimizer = tuple(keep_full), optimizer
        self.epochs_done = 0
        self.factorization: Factorization | None = None

    @property
    def switched(self) -> bool:
        return self.factorization is not None

    def epoch_end(self) -> Factorization | None:
        """Count one epoch; at the end of epoch `epochs`, factorise (SVD init from the weights
        trained so far), move the optimizer, and return the `Factorization`. None otherwise."""
        self.epochs_done += 1
        if self.switched or self.epochs_done < self.epochs:
            return None
        factorization = factorize(self.model, self.ratio, self.keep_full)
        self.model = factorization.model
        if self.optimizer is not None:
            move_optimizer(self.optimizer, factorization.replaced)
        self.factorization = factorization
        return factorization

    def __repr__(self) -> str:
        if self.switched:
            state = f"factorised at the end of epoch {self.epochs}"
        else:
            state = f"full rank, {self.epochs_done} of {self.epochs} warm-up epochs done"
        return (
            f"<pufferfish warm-up: {state}; rank ratio {self.ratio:g}, "
            f"{len(self.plan.factorized)} layers to factorise>"
        )
