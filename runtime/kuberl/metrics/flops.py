"""Model FLOPs utilisation."""

from __future__ import annotations


def mfu(n_params: int, tokens: float, seconds: float, peak_flops: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: 6·N·tokens / (seconds · peak · devices). N excludes embeddings."""
    if seconds <= 0 or peak_flops <= 0:
        return 0.0
    return 6.0 * n_params * tokens / (seconds * peak_flops * devices)
