"""With DDP, a factorised model all-reduces its factors only: the bytes a counting comm hook
sees per step, in a real 2-process gloo run, equal the closed form of `counts`, also after a
warm-up's switch and a new DDP wrapper, as docs/pufferfish.md tells users to do. (The model is
small, with convolutions, batch norm, a transformer layer and a classifier, to keep the test
cheap; benchmarks/pufferfish_ddp.py does the same for ResNet-18.)"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kernelfleet.tools.pufferfish.ddp import ByteCounter, counting_allreduce_hook
from kernelfleet.tools.pufferfish.factorize import factorize, plan_factorization
from kernelfleet.tools.pufferfish.warmup import Warmup

STEPS = 2


class Mixed(nn.Module):
    """Convolutions with batch norm, then a transformer encoder layer over the pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Sequential(
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.mixer = nn.TransformerEncoderLayer(
            32, 4, dim_feedforward=128, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.body(self.stem(x)).flatten(2).transpose(1, 2)
        return self.head(self.mixer(tokens).mean(1))


def model_for(ratio: float | None) -> nn.Module:
    torch.manual_seed(0)
    model = Mixed()
    if ratio is not None:
        factorize(model, ratio)
    return model


def counted_steps(ddp: DistributedDataParallel, rank: int, steps: int) -> list[int]:
    """Train `steps` steps (SGD), each rank on its own data; the bytes all-reduced per step."""
    counter = ByteCounter()
    ddp.register_comm_hook(counter, counting_allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    per_step = []
    for _ in range(steps):
        counter.reset()
        optimizer.zero_grad()
        x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
        nn.functional.cross_entropy(ddp(x), y).backward()
        per_step.append(counter.bytes)
    return per_step


def worker(rank: int, folder: str) -> None:
    """One DDP rank: train the full and the factorised model STEPS steps each, counting the
    bytes the hook all-reduces per step, with a checksum of the last gradients; then a warm-up
    epoch at full rank, the switch, and the factorised model wrapped again."""
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2
    )
    torch.set_num_threads(1)
    found: dict[str, object] = {}
    try:
        for label, ratio in (("full", None), ("factorised", 0.25)):
            ddp = DistributedDataParallel(model_for(ratio))
            per_step = counted_steps(ddp, rank, STEPS)
            checksum = sum(p.grad.double().sum().item() for p in ddp.parameters())
            found[label] = {"bytes": per_step, "checksum": checksum}
        warmup = Warmup(model_for(None), 0.25, epochs=1)
        before = counted_steps(DistributedDataParallel(warmup.model), rank, 1)
        warmup.epoch_end()
        after = counted_steps(DistributedDataParallel(warmup.model), rank, 1)
        found["warmup"] = before + after
        del ddp, warmup
    finally:
        gc.collect()  # every DDP reducer goes before its process group
        dist.barrier()
        dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(found))


@pytest.mark.slow
def test_ddp_allreduces_the_factors_only(tmp_path: Path) -> None:
    mp.spawn(worker, args=(str(tmp_path),), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    plan = plan_factorization(model_for(None), 0.25)
    assert ranks[0]["full"]["bytes"] == [plan.bytes_before] * STEPS
    assert ranks[0]["factorised"]["bytes"] == [plan.bytes_after] * STEPS
    factorised = {layer.name for layer in plan.factorized}
    assert factorised == {"body.0", "mixer.linear1", "mixer.linear2"}  # stem, head kept full
    assert plan.bytes_after < plan.bytes_before * 0.8
    assert ranks[0]["warmup"] == [plan.bytes_before, plan.bytes_after]
    for label in ("full", "factorised"):
        # the hook really reduced: both ranks hold the same (averaged) gradients
        assert ranks[0][label] == pytest.approx(ranks[1][label], rel=1e-9)
