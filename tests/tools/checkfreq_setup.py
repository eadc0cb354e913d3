"""A small seeded training setup for the checkfreq tests: the objects a notebook would bind."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy
import torch
from torch.utils.data import TensorDataset

with warnings.catch_warnings():  # torchdata calls a deprecated torch function at import
    warnings.simplefilter("ignore", UserWarning)
    from torchdata.stateful_dataloader import StatefulDataLoader


def training_objects(seed: int = 0, samples: int = 96) -> dict[str, Any]:
    """model, optimizer, scheduler and loader (batches of 10, shuffled by torch's RNG) over a
    fixed data set; the model's initial weights and the RNGs are seeded with `seed`."""
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data) + 0.1 * torch.randn(samples, 1, generator=data)
    y = y.squeeze(1)
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.BatchNorm1d(16),
        torch.nn.Linear(16, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loader = StatefulDataLoader(
            TensorDataset(x, y, torch.arange(samples)), batch_size=10, shuffle=True
        )
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}


Record = tuple[int, float, list[int]]


def train(objects: dict[str, Any], steps: int, start: int = 0) -> list[Record]:
    """Run the plain loop from step `start` to `steps`; return (step, loss, the batch's sample
    ids) for each step."""
    return list(steps_of(objects, steps, start))


def steps_of(objects: dict[str, Any], steps: int, start: int = 0) -> Iterator[Record]:
    """The plain loop (no checkpointing code: CheckFreq hooks ``optimizer.step``) from step
    `start` to `steps`, yielding (step, loss, the batch's sample ids) after each step."""
    model, optimizer = objects["model"], objects["optimizer"]
    scheduler, loader = objects["scheduler"], objects["loader"]
    step = start
    while step < steps:
        for xb, yb, ids in loader:
            noise = random.random() * 1e-3 + float(numpy.random.rand()) * 1e-3
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb) + noise
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            yield step, loss.item(), ids.tolist()
            if step >= steps:
                break
