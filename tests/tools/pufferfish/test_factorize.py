"""Factorising whole models: outputs at full rank, the keep-full rules, what stays full and
why, and parameter counts against the closed form."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernelfleet.tools.pufferfish.counts import allreduce_bytes, trainable_params
from kernelfleet.tools.pufferfish.errors import NothingToFactorize
from kernelfleet.tools.pufferfish.factorize import ATTENTION_KEPT, factorize, plan_factorization
from kernelfleet.tools.pufferfish.layers import FactorizedConv2d, FactorizedLinear
from kernelfleet.tools.pufferfish.models import resnet18


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)


def encoder(batch_first: bool = True) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        32, 4, dim_feedforward=64, dropout=0.0, batch_first=batch_first
    )
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def test_resnet18_at_full_rank_reproduces_outputs() -> None:
    model = resnet18().eval()
    x = torch.randn(2, 3, 16, 16)
    expected = model(x)
    done = factorize(model, 1.0, keep_full=["none"])
    assert done.model is model
    assert len(done.plan.factorized) == 21  # 17 3x3 convs, 3 shortcuts, the classifier
    assert isinstance(model.layer4[1].conv2, FactorizedConv2d)
    assert isinstance(model.fc, FactorizedLinear)
    torch.testing.assert_close(model(x), expected)


def test_resnet18_at_a_quarter_counts_as_the_closed_form() -> None:
    model = resnet18()
    before = trainable_params(model)
    bytes_before = allreduce_bytes(model.parameters())
    done = factorize(model, 0.25)
    plan = done.plan
    assert (
        (plan.params_before, plan.bytes_before)
        == (before, bytes_before)
        == (11_173_962, 44_695_848)
    )
    assert trainable_params(model) == plan.params_after
    assert allreduce_bytes(model.parameters()) == plan.bytes_after == 4 * plan.params_after
    kept = {layer.name: layer.why_full for layer in plan.layers if layer.rank is None}
    assert kept == {"conv1": "kept full: first", "fc": "kept full: last"}
    conv = next(layer for layer in plan.layers if layer.name == "layer4.1.conv2")
    assert (conv.full_rank, conv.rank) == (512, 128)
    assert conv.params_after == 128 * 512 * 9 + 128 * 512  # r c_in k^2 + r c_out


def test_transformer_ffn_is_factorised_and_attention_kept_full() -> None:
    model = encoder()
    x = torch.randn(3, 7, 32)
    model.train()  # dropout is 0: training mode is deterministic, and takes the Python path
    expected = model(x)
    model.eval()
    with torch.no_grad():
        expected_fast = model(x)  # the fused fast path of TransformerEncoderLayer
    done = factorize(model, 1.0, keep_full=["none"])
    names = {layer.name: layer for layer in done.plan.layers}
    assert names["layers.0.self_attn"].why_full == ATTENTION_KEPT
    assert names["layers.0.self_attn"].params_after == 4 * 32 * 32 + 4 * 32
    assert "layers.0.self_attn.out_proj" not in names
    assert isinstance(model.layers[1].linear2, FactorizedLinear)
    assert isinstance(model.layers[0].self_attn.out_proj, nn.Linear)
    model.train()
    torch.testing.assert_close(model(x), expected)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected_fast)
    assert trainable_params(model) == done.plan.params_after


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_transformer_encoder_with_nested_tensors_and_a_padding_mask() -> None:
    model = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True), 2
    ).eval()
    x = torch.randn(3, 7, 32)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True
    with torch.no_grad():  # the encoder's nested-tensor path, then each layer's fused one
        expected = model(x, src_key_padding_mask=padding)
    factorize(model, 1.0, keep_full=["none"])
    assert not model.use_nested_tensor
    with torch.no_grad():
        got = model(x, src_key_padding_mask=padding)
    torch.testing.assert_close(got[1:], expected[1:])
    # the nested path leaves padded positions at 0; the Python path computes them: compare
    # the positions the mask keeps
    torch.testing.assert_close(got[0, :5], expected[0, :5])


def test_keep_full_rules() -> None:
    model = resnet18()
    hybrid = plan_factorization(model, 0.25, ["first:5", "last"])
    assert [c.name for c in hybrid.layers if c.rank is None] == [
        "conv1",
        "layer1.0.conv1",
        "layer1.0.conv2",
        "layer1.1.conv1",
        "layer1.1.conv2",
        "fc",
    ]
    by_name = plan_factorization(model, 0.25, ["layer4", "fc"])
    kept = [c.name for c in by_name.layers if c.rank is None]
    assert kept[0] == "layer4.0.conv1"
    assert kept[-1] == "fc"
    assert len(kept) == 6
    with pytest.raises(ValueError, match="keep-full layer9: no such layer"):
        plan_factorization(model, 0.25, ["layer9"])
    with pytest.raises(ValueError, match="rank ratio"):
        plan_factorization(model, 1.5)


def test_what_cannot_be_factorised_says_why() -> None:
    with pytest.raises(NothingToFactorize, match="has no Linear or Conv2d layer"):
        factorize(nn.Sequential(nn.BatchNorm1d(4), nn.ReLU()), 0.5)
    with pytest.raises(NothingToFactorize, match=r"0: kept full: first; 1: kept full: last"):
        factorize(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), 0.5)
    depthwise = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 16, 1), nn.Linear(4, 4))
    plan = plan_factorization(depthwise, 0.5, ["none"])
    assert [(c.name, c.rank, c.why_full) for c in plan.layers] == [
        ("0", None, "groups=8"),
        ("1", 4, ""),
        ("2", 2, ""),
    ]
    tied = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10, bias=False), nn.Linear(10, 10))
    tied[1].weight = tied[0].weight
    plan = plan_factorization(tied, 0.5, ["none"])
    assert plan.layers[0].why_full == "weight shared with another module"
    assert plan.params_before == trainable_params(tied)


def test_a_model_that_is_one_layer_is_replaced() -> None:
    layer = nn.Linear(12, 9)
    x = torch.randn(4, 12)
    done = factorize(layer, 1.0, keep_full=["none"])
    assert isinstance(done.model, FactorizedLinear)
    torch.testing.assert_close(done.model(x), layer(x))
