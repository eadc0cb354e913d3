"""Factorised layers: SVD initialisation reproduces a full-rank layer exactly at full rank, and
gives the best low-rank approximation below it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kernelfleet.tools.pufferfish.layers import (
    FactorizedConv2d,
    FactorizedLinear,
    check_ratio,
    full_rank,
    rank_for,
    svd_factors,
)


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize(("out_features", "in_features", "bias"), [(24, 40, True), (40, 24, False)])
def test_linear_at_full_rank_reproduces_the_layer(
    out_features: int, in_features: int, bias: bool
) -> None:
    layer = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(5, 3, in_features)
    pair = FactorizedLinear.from_full(layer, full_rank(layer))
    assert pair.rank == min(in_features, out_features)
    torch.testing.assert_close(pair(x), layer(x))
    assert pair.u.bias is layer.bias  # the same Parameter: optimizer state follows it


@pytest.mark.parametrize(
    "options",
    [
        {"stride": 2, "padding": 1, "bias": True},
        {"stride": 1, "padding": 2, "dilation": 2, "bias": False},
        {"stride": (1, 2), "padding": (0, 1), "bias": True, "padding_mode": "reflect"},
    ],
)
def test_conv2d_at_full_rank_reproduces_the_layer(options: dict[str, object]) -> None:
    layer = nn.Conv2d(6, 10, (3, 3), **options)  # type: ignore[arg-type]
    x = torch.randn(2, 6, 11, 13)
    pair = FactorizedConv2d.from_full(layer, full_rank(layer))
    assert pair.rank == 10
    assert pair.v.weight.shape == (10, 6, 3, 3)
    assert pair.u.weight.shape == (10, 10, 1, 1)
    torch.testing.assert_close(pair(x), layer(x))


def test_a_conv_whose_patch_is_the_smaller_side() -> None:
    layer = nn.Conv2d(2, 32, 3, padding=1)  # full rank min(32, 2 * 9) = 18
    pair = FactorizedConv2d.from_full(layer, full_rank(layer))
    x = torch.randn(1, 2, 6, 6)
    assert pair.rank == 18
    torch.testing.assert_close(pair(x), layer(x))


def test_below_full_rank_the_factors_are_the_best_approximation() -> None:
    weight = torch.randn(30, 50)
    singular = torch.linalg.svdvals(weight.double())
    for rank in (1, 7, 30):
        u, v_t = svd_factors(weight, rank)
        assert u.shape == (30, rank)
        assert v_t.shape == (rank, 50)
        error = torch.linalg.matrix_norm((u @ v_t - weight).double())
        expected = singular[rank:].square().sum().sqrt()  # Eckart-Young
        assert error.item() == pytest.approx(expected.item(), abs=1e-4)
        # U = A sqrt(S), V^T = sqrt(S) B^T: both factors carry the same singular values
        torch.testing.assert_close(
            torch.linalg.vector_norm(u.double(), dim=0), singular[:rank].sqrt(), rtol=1e-5, atol=0
        )


def test_ranks_and_ratios() -> None:
    assert [rank_for(64, r) for r in (0.25, 0.1, 1.0, 0.001)] == [16, 7, 64, 1]
    assert rank_for(30, 0.1) == 3  # 0.1 * 30 is 3.0000000000000004 in floating point
    for bad in (0, -0.5, 1.01, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"the rank ratio must be in \(0, 1\]"):
            check_ratio(bad)
    with pytest.raises(ValueError, match=r"rank 11 is outside 1\.\.10"):
        FactorizedLinear(10, 20, 11)
    with pytest.raises(ValueError, match="groups=2"):
        FactorizedConv2d(nn.Conv2d(4, 4, 3, groups=2), 1)
