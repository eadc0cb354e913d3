"""Torch tensors and modules sync with their bytes out of band (torch is a test dependency)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .conftest import Cluster

Replicas = Callable[..., Cluster]


def test_tensors_of_every_shape_and_dtype_arrive_equal(replicas: Replicas) -> None:
    cluster = replicas()
    cluster.run(
        0,
        "import torch\n"
        "t = torch.arange(12, dtype=torch.float32).reshape(3, 4)\n"
        "bf = torch.linspace(0, 1, 7, dtype=torch.bfloat16)\n"
        "flags = torch.tensor([True, False])\n"
        "scalar = torch.tensor(3.5)\n"
        "empty = torch.empty(0, 3)\n"
        "transposed = t.t()\n"
        "w = torch.nn.Parameter(torch.randn(3))\n"
        "big = torch.randn(512, 1024)",
    )
    executor, follower = cluster.namespaces
    for name in ["t", "bf", "flags", "scalar", "empty", "transposed", "w", "big"]:
        sent, got = executor[name], follower[name]
        assert type(got) is type(sent), name
        assert got.dtype == sent.dtype, name
        assert got.shape == sent.shape, name
        assert torch.equal(got.detach(), sent.detach()), name
        assert got.requires_grad == sent.requires_grad, name
    assert "big" in cluster.entries[0]["pointers"]
    follower["t"][0, 0] = -1.0  # arrives writable
    assert executor["t"][0, 0] == 0.0


def test_a_notebook_model_trains_on_one_replica_and_continues_on_another(
    replicas: Replicas,
) -> None:
    cluster = replicas()
    cluster.run(
        0,
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(64, 8)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x).relu()\n"
        "torch.manual_seed(0)\n"
        "net = Net()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "x = torch.randn(16, 64)",
    )
    step = "loss = net(x).sum()\nopt.zero_grad()\nloss.backward()\nopt.step()\nloss = loss.item()"
    executor, follower = cluster.namespaces
    assert follower["opt"].param_groups[0]["params"][0] is follower["net"].fc.weight
    sent = cluster.run(0, step)
    assert "net" in sent.names()  # trained in place: same object, new content
    assert isinstance(follower["net"], follower["Net"])
    assert torch.equal(follower["net"].fc.weight, executor["net"].fc.weight)
    before = follower["net"].fc.weight.detach().clone()
    back = cluster.run(1, step)  # the other replica runs the next training step
    assert not torch.equal(follower["net"].fc.weight, before)  # its optimizer moved its model
    assert {"net", "opt"} <= back.names()
    assert torch.equal(follower["net"].fc.weight, executor["net"].fc.weight)
    assert executor["opt"].param_groups[0]["params"][0] is executor["net"].fc.weight
    only_net = cluster.run(0, "net.eval()")  # opt unchanged, but shares net's parameters
    assert any("," in label for label in (*only_net.changed, *only_net.pointers))
    assert follower["opt"].param_groups[0]["params"][1] is follower["net"].fc.bias
    assert len(set(cluster.digests())) == 1
