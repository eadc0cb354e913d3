"""Closed-form parameter and all-reduce byte counts of full-rank and factorised layers.

Parameters. A Linear of m outputs and n inputs holds ``m n`` weights; factorised at rank r,
U (m x r) and V^T (r x n) hold ``r (m + n)``. A Conv2d (c_out, c_in, k_h, k_w) holds
``c_out c_in k_h k_w``; factorised, the k_h x k_w convolution c_in -> r holds ``r c_in k_h k_w``
and the 1 x 1 convolution r -> c_out holds ``r c_out``. A bias adds m (or c_out) to both, since
the factorised layer keeps the same bias. Factorising pays when ``r (m + n) < m n``, i.e.
``r < m n / (m + n)``; at Pufferfish's ratio 1/4 of min(m, n) it always does, at ratio 1 it
never does (the acceptance test of exactness, not a configuration to train).

All-reduce bytes. Data-parallel training (PyTorch DDP) reduces, once per optimizer step, the
gradient of every parameter that requires one, packed into flat buckets: each bucket's buffer
is the concatenation of its gradients, so what the all-reduce carries per step, summed over
buckets, is ``sum over trainable parameters of numel x element size``: the parameter count times
4 bytes in float32. A factorised model therefore all-reduces its factors (and the layers it
kept), never a full-rank W, and the ratio of bytes is the ratio of parameter counts. This is the
payload of the reduction; a ring all-reduce over p workers sends ``2 (p - 1) / p`` times it from
each worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def linear_params(out_features: int, in_features: int, bias: bool, rank: int | None = None) -> int:
    """Parameters of a Linear layer: ``m n + m`` full, ``r (m + n) + m`` at `rank` r (the
    bias term only when `bias`)."""
    bias_count = out_features if bias else 0
    if rank is None:
        return out_features * in_features + bias_count
    return rank * (out_features + in_features) + bias_count


def conv2d_params(
    out_channels: int,
    in_channels: int,
    kernel: tuple[int, int],
    bias: bool,
    rank: int | None = None,
) -> int:
    """Parameters of a Conv2d (groups 1): ``c_out c_in k_h k_w + c_out`` full,
    ``r c_in k_h k_w + r c_out + c_out`` at `rank` r (the bias term only when `bias`)."""
    bias_count = out_channels if bias else 0
    patch = in_channels * kernel[0] * kernel[1]
    if rank is None:
        return out_channels * patch + bias_count
    return rank * patch + rank * out_channels + bias_count


def allreduce_bytes(parameters: Iterable[nn.Parameter]) -> int:
    """What DDP all-reduces per step for these parameters: numel x element size of each one
    that requires a gradient, each distinct tensor once (module docstring)."""
    seen: set[int] = set()
    total = 0
    for parameter in parameters:
        if parameter.requires_grad and id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel() * parameter.element_size()
    return total


def trainable_params(module: nn.Module) -> int:
    """The number of distinct parameters of `module` that require a gradient."""
    distinct = {id(p): p for p in module.parameters() if p.requires_grad}
    return sum(p.numel() for p in distinct.values())
