"""KL(pi || ref) estimators (a registry), PPO reward shaping with the KL, and KL controllers."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kuberl.registry import Registry
from kuberl.spec.model import KL_ESTIMATOR_NAMES

LOG_RATIO_CLAMP = 20.0

KLEstimator = Callable[[Tensor, Tensor], Tensor]  # (logprobs [B, T], ref_logprobs [B, T]) -> kl [B, T]


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", "spec.algorithm.kl.estimator", KL_ESTIMATOR_NAMES)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``logp - ref_logp`` per token, [B, T] (unbiased, can be negative)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``exp(r) - r - 1`` with ``r = ref_logp - logp`` clamped to [-20, 20], [B, T] (Schulman's
    unbiased, low-variance estimator, always >= 0)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - log_ratio - 1.0


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || ref) estimate from sampled-token log-probs, [B, T] -> [B, T], by the
    estimator's name (``"k1"``, ``"k3"``) or import path."""
    return KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)


def _last_valid_index(mask: Tensor) -> tuple[Tensor, Tensor]:
    """For mask [B, T]: (index of the last nonzero entry per row [B], whether the row has one [B])."""
    valid = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    return (valid * positions).argmax(dim=1), valid.any(dim=1)


def token_rewards(scores: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """PPO reward shaping (Ziegler et al. 2019): [B, T] per-token rewards.

    ``-kl_coef * kl`` on every valid token (``kl`` [B, T], optional), plus ``scores[b]`` ([B]) on the
    last valid token of row b. 0 where mask is 0; a row with no valid token gets nothing.
    """
    mask = mask.to(scores.dtype)
    rewards = -kl_coef * kl * mask if kl is not None else torch.zeros_like(mask)
    last, has_token = _last_valid_index(mask)
    final = torch.zeros_like(rewards).scatter(1, last[:, None], (scores * has_token)[:, None])
    return rewards + final


class _KLController:
    """Holds the KL coefficient ``.value`` and (de)serialises it for checkpoints."""

    value: float

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, d: dict[str, float]) -> None:
        self.value = float(d["value"])


class FixedKLController(_KLController):
    """Constant KL coefficient ``.value``."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""


class AdaptiveKLController(_KLController):
    """Adaptive KL coefficient (Ziegler et al. 2019): steers the observed KL towards ``target``.

    ``update``: ``e = clip(current_kl / target - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL controller needs target > 0 and horizon > 0, got {target=}, {horizon=}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``.value`` after ``n_steps`` samples/steps that showed mean KL ``current_kl``."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def make_kl_controller(
    kind: str, coef: float, target: float | None = None, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build a KL controller: ``kind`` is "fixed" or "adaptive" (which requires ``target``)."""
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        if target is None:
            raise ValueError("adaptive KL controller requires a target KL")
        return AdaptiveKLController(coef, target, horizon)
    raise ValueError(f"unknown KL controller kind {kind!r}; allowed: fixed, adaptive")
