"""Factorised layers: a full-rank weight W replaced by two thin factors, W = U V^T.

A Linear layer of weight W (m x n: m outputs, n inputs) becomes `FactorizedLinear`: first
V^T (r x n), then U (m x r), so ``y = U (V^T x) + b``. A Conv2d of weight (c_out, c_in, k_h,
k_w) becomes `FactorizedConv2d`: a k_h x k_w convolution c_in -> r with the layer's stride,
padding and dilation, then a 1 x 1 convolution r -> c_out that adds the bias. Seen as matrices,
the convolution's W reshaped to c_out x (c_in k_h k_w) is U (c_out x r) times V^T (r x c_in k_h
k_w), as Pufferfish (MLSys'21) factorises it.

`from_full` builds either from a full-rank layer with Pufferfish's SVD initialisation: with W =
A S B^T (the thin SVD), U = A_r sqrt(S_r) and V^T = sqrt(S_r) B_r^T, the r largest singular
values. At r = rank(W) the product is W again (up to rounding); below it, the best rank-r
approximation of W (Eckart-Young). The bias is the full layer's own `Parameter` object, moved
to the second factor, so an optimizer's state for it survives the swap.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def svd_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, V^T) of a matrix `weight` (m x n) at `rank`: U is m x rank, V^T rank x n, and U @ V^T
    the best rank-`rank` approximation of `weight`. Computed in float64, returned in the
    weight's dtype."""
    if weight.dim() != 2:
        raise ValueError(f"expected a matrix, got a tensor of shape {tuple(weight.shape)}")
    if not 1 <= rank <= min(weight.shape):
        raise ValueError(f"rank {rank} is outside 1..{min(weight.shape)} for {tuple(weight.shape)}")
    matrix = weight.detach().double()
    if matrix.shape[0] < matrix.shape[1]:  # LAPACK is several times faster on tall matrices
        right, singular, left_t = torch.linalg.svd(matrix.T, full_matrices=False)
        left, right_t = left_t.T, right.T
    else:
        left, singular, right_t = torch.linalg.svd(matrix, full_matrices=False)
    root = singular[:rank].sqrt()
    u = left[:, :rank] * root
    v_t = root[:, None] * right_t[:rank]
    return u.to(weight.dtype), v_t.to(weight.dtype)


class FactorizedLinear(nn.Module):
    """``u(v(x))``: `v` is Linear(in_features -> rank, no bias) holding V^T, `u` is
    Linear(rank -> out_features) holding U and the bias."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        if not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"rank {rank} is outside 1..{min(in_features, out_features)}")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.v = nn.Linear(in_features, rank, bias=False)
        self.u = nn.Linear(rank, out_features, bias=bias)

    @classmethod
    def from_full(cls, layer: nn.Linear, rank: int) -> FactorizedLinear:
        """`layer` at `rank`, SVD-initialised (module docstring), on its device and dtype."""
        weight = layer.weight
        factorized = cls(layer.in_features, layer.out_features, rank, bias=False)
        factorized.to(device=weight.device, dtype=weight.dtype)
        u, v_t = svd_factors(weight, rank)
        with torch.no_grad():
            factorized.u.weight.copy_(u)
            factorized.v.weight.copy_(v_t)
        factorized.u.bias = layer.bias
        return factorized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(self.v(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


class FactorizedConv2d(nn.Module):
    """``u(v(x))``: `v` is Conv2d(in_channels -> rank, the full layer's kernel, stride, padding,
    dilation and padding mode, no bias), `u` a 1 x 1 Conv2d(rank -> out_channels) with the
    bias. Only ``groups=1`` convolutions factorise this way."""

    def __init__(self, full: nn.Conv2d, rank: int) -> None:
        super().__init__()
        if full.groups != 1:
            raise ValueError(f"a convolution with groups={full.groups} is not factorised")
        kernel_h, kernel_w = full.kernel_size
        full_rank = min(full.out_channels, full.in_channels * kernel_h * kernel_w)
        if not 1 <= rank <= full_rank:
            raise ValueError(f"rank {rank} is outside 1..{full_rank}")
        self.in_channels, self.out_channels, self.rank = full.in_channels, full.out_channels, rank
        padding = full.padding if isinstance(full.padding, str) else _pair(full.padding)
        self.v = nn.Conv2d(
            full.in_channels,
            rank,
            _pair(full.kernel_size),
            stride=_pair(full.stride),
            padding=padding,
            dilation=_pair(full.dilation),
            bias=False,
            padding_mode=full.padding_mode,
        )
        self.u = nn.Conv2d(rank, full.out_channels, 1, bias=full.bias is not None)

    @classmethod
    def from_full(cls, layer: nn.Conv2d, rank: int) -> FactorizedConv2d:
        """`layer` at `rank`, SVD-initialised (module docstring), on its device and dtype."""
        weight = layer.weight
        factorized = cls(layer, rank)
        factorized.to(device=weight.device, dtype=weight.dtype)
        u, v_t = svd_factors(weight.reshape(weight.shape[0], -1), rank)
        with torch.no_grad():
            factorized.u.weight.copy_(u.reshape(layer.out_channels, rank, 1, 1))
            factorized.v.weight.copy_(v_t.reshape(rank, *weight.shape[1:]))
        factorized.u.bias = layer.bias
        return factorized

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(self.v(x))

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.v.kernel_size}, "
            f"rank={self.rank}"
        )


def _pair(values: tuple[int, ...]) -> tuple[int, int]:
    first, second = values
    return first, second


def full_rank(layer: nn.Linear | nn.Conv2d) -> int:
    """The rank W can have: min(m, n) for a Linear, min(c_out, c_in k_h k_w) for a Conv2d."""
    if isinstance(layer, nn.Linear):
        return min(layer.in_features, layer.out_features)
    return min(layer.out_channels, layer.in_channels * math.prod(layer.kernel_size))


def rank_for(full: int, ratio: float) -> int:
    """Pufferfish's rank at `ratio` of `full`: ceil(ratio * full), at least 1."""
    check_ratio(ratio)
    # the tolerance keeps float noise (0.1 * 30 = 3.0000000000000004) from adding a rank
    return max(1, math.ceil(ratio * full - 1e-9))


def check_ratio(ratio: float) -> None:
    """Raise ValueError, in one line, unless 0 < `ratio` <= 1."""
    if not (isinstance(ratio, int | float) and 0 < ratio <= 1):
        raise ValueError(f"the rank ratio must be in (0, 1], got {ratio!r}")
