"""Reward shaping that depends on the response, not the task: pure functions on per-sample tensors."""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): lengths [B] (response tokens) -> [B], 0 up to
    ``max_len - buffer`` tokens, then falling linearly to ``-penalty`` at ``max_len``, and ``-penalty`` past it."""
    over = (lengths.float() - (max_len - buffer)).clamp_min(0.0)
    return -penalty * torch.minimum(over / buffer, torch.ones_like(over))
