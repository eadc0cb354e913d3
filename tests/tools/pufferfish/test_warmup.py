"""Full-rank warm-up, then the switch: SVD initialisation from the trained weights, and the
optimizer moved onto the factors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernelfleet.tools.pufferfish.errors import NothingToFactorize
from kernelfleet.tools.pufferfish.layers import FactorizedConv2d, FactorizedLinear
from kernelfleet.tools.pufferfish.warmup import Warmup


def small_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, data: list) -> float:
    total = 0.0
    for x, y in data:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(data)


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, torch.optim.Adam])
def test_the_switch_keeps_outputs_and_moves_the_optimizer(optimizer_class: type) -> None:
    torch.manual_seed(0)
    model = small_net()
    data = [(torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))) for _ in range(4)]
    options = {"lr": 0.05, "momentum": 0.9} if optimizer_class is torch.optim.SGD else {"lr": 1e-3}
    optimizer = optimizer_class(model.parameters(), **options)
    warmup = Warmup(model, 1.0, epochs=2, keep_full=["first"], optimizer=optimizer)
    kept_conv, swapped = model[0], model[2]
    assert "0 of 2 warm-up epochs done" in repr(warmup)

    train_epoch(model, optimizer, data)
    assert warmup.epoch_end() is None
    assert isinstance(model[2], nn.Conv2d)
    train_epoch(model, optimizer, data)
    x = data[0][0]
    with torch.no_grad():
        before = model(x)
    kept_state = optimizer.state[kept_conv.weight]
    bias_state = optimizer.state[swapped.bias]
    done = warmup.epoch_end()

    assert done is not None
    assert warmup.switched
    assert "factorised at the end of epoch 2" in repr(warmup)
    assert model[0] is kept_conv
    assert isinstance(model[2], FactorizedConv2d)
    assert isinstance(model[5], FactorizedLinear)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)
    params = optimizer.param_groups[0]["params"]
    assert [id(p) for p in params] == [id(p) for p in model.parameters()]
    assert optimizer.state[kept_conv.weight] is kept_state  # untouched layers keep their state
    assert optimizer.state[model[2].u.bias] is bias_state  # the bias moved with its state
    assert swapped.weight not in optimizer.state
    assert model[2].v.weight not in optimizer.state  # factors start fresh
    first = train_epoch(model, optimizer, data)
    for _ in range(5):
        last = train_epoch(model, optimizer, data)
    assert last < first  # the factorised model trains on
    assert warmup.epoch_end() is None
    assert warmup.epochs_done == 3


def test_refusals_come_before_training() -> None:
    with pytest.raises(NothingToFactorize):
        Warmup(nn.Sequential(nn.Linear(4, 4)), 0.5, epochs=1)
    with pytest.raises(ValueError, match="warm-up epochs must be 1 or more"):
        Warmup(small_net(), 0.5, epochs=0)
    with pytest.raises(ValueError, match="rank ratio"):
        Warmup(small_net(), 0.0, epochs=3)
