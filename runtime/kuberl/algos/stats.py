"""Masked statistics over response tokens. A `mask` is 1 (or True) on real tokens; float or bool."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements when None). ``x`` and ``mask`` broadcast.

    Masked-out entries contribute exactly 0 even when they hold inf/nan (and pass no gradient).
    """
    mask = mask.to(x.dtype)
    x = torch.where(mask != 0, x * mask, 0.0)
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries with mask 1 (a weighted mean for fractional masks), over ``dim``.

    Where the mask sums to 0 the result is 0, not nan.
    """
    total = masked_sum(x, mask, dim)
    count = masked_sum(torch.ones_like(x), mask, dim)
    return total / torch.where(count == 0, 1.0, count)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` [B, T] to zero mean, unit (unbiased) variance over the masked entries.

    With ``shift_mean=False`` the original mean is added back (only the scale changes).
    Masked-out positions are 0 in the result.
    """
    mean = masked_mean(x, mask)
    n = masked_sum(torch.ones_like(x), mask)
    var = masked_sum((x - mean) ** 2, mask) / (n - 1).clamp_min(1.0)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, 0.0)


def aggregation_weights(mask: Tensor, mode: str, tokens: Tensor, sequences: Tensor) -> Tensor:
    """Per-token weights [B, T] that turn per-token loss terms x [B, T] into one mini-batch loss, sum(w * x)
    over every rank's rows, under aggregation `mode` (spec.algorithm.lossAggregation). `mask` [B, T]: this
    rank's part; `tokens`, `sequences`: the mini-batch's valid tokens and sequences over all ranks (0-dim).

    token-mean: 1 / tokens. seq-mean-token-mean: 1 / (sequences * its length). seq-mean-token-sum:
    1 / sequences. seq-mean-token-sum-norm: 1 / (sequences * T), T the padded response length, a constant."""
    m = mask.float()
    if mode == "token-mean":
        return m / tokens.clamp_min(1.0)
    per_seq = m / sequences.clamp_min(1.0)
    if mode == "seq-mean-token-sum":
        return per_seq
    if mode == "seq-mean-token-mean":
        return per_seq / m.sum(-1, keepdim=True).clamp_min(1.0)
    if mode == "seq-mean-token-sum-norm":
        return per_seq / m.shape[-1]
    raise ValueError(f"spec.algorithm.lossAggregation: unknown mode {mode!r}")
