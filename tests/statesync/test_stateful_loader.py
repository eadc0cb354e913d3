"""A torchdata StatefulDataLoader that has yielded batches still syncs: its position travels,
its live iterator does not, and the follower's copy yields the executor's next batch."""

from __future__ import annotations

import pytest

from kernelfleet.kernels.replica.statesync_pickling import loads_frame, serialize

torch = pytest.importorskip("torch")
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")

# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates, when a loader is made
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def test_a_loader_mid_epoch_syncs_at_its_position():
    torch.manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2))
    loader = stateful_dataloader.StatefulDataLoader(data, batch_size=2, shuffle=True)
    batches = iter(loader)
    for _ in range(4):
        next(batches)

    copy = loads_frame(serialize(loader, {}).to_bytes(), {})

    assert type(copy) is type(loader)
    ahead = [b[0] for b in copy]
    rest = [b[0] for b in batches]
    assert len(ahead) == len(rest) == 6
    assert all(torch.equal(a, b) for a, b in zip(ahead, rest, strict=True))
    assert [b[0].shape for b in copy] == [torch.Size([2, 2])] * 10, "a new epoch: every batch"
