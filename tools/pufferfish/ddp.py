"""A DDP communication hook that counts what it all-reduces.

``ddp.register_comm_hook(counter, counting_allreduce_hook)`` makes DDP hand each gradient bucket
to the hook, which adds the bucket's flat buffer (numel x element size) to ``counter.bytes`` and
then all-reduces it exactly as DDP's default does (``default_hooks.allreduce_hook``: sum, then
divide by the group's size). After a training step ``counter.bytes`` is the all-reduce payload
of that step, which `counts` derives in closed form.

(No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.)
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


@dataclass
class ByteCounter:
    """The hook's state: the process group to reduce over (None: the default group), and the
    bytes and buckets all-reduced so far."""

    process_group: dist.ProcessGroup | None = None
    bytes: int = 0
    buckets: int = 0

    def reset(self) -> None:
        self.bytes = self.buckets = 0


def counting_allreduce_hook(
    state: ByteCounter, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Count `bucket`'s buffer, then all-reduce it as DDP's default hook does."""
    buffer = bucket.buffer()
    state.bytes += buffer.numel() * buffer.element_size()
    state.buckets += 1
    return default_hooks.allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]
