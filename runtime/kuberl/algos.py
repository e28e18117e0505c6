"""RL algorithms as pure torch functions: masked statistics, advantages, KL, losses, KL controllers.

Conventions: ``B`` is the batch (samples), ``T`` the response length, ``V`` the vocabulary. A ``mask``
is 1 (or True) on real response tokens and 0 on padding / after EOS; it may be float or bool.
Nothing here touches torch.distributed: statistics are over the local batch only.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "broadcast_to_tokens",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "policy_loss",
    "token_rewards",
    "value_loss",
]

KL_ESTIMATORS = ("k1", "k3")
_LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------- masked statistics


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


# --------------------------------------------------------------------------- advantages


@torch.no_grad()
def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over response tokens.

    ``rewards``, ``values``, ``mask``: [B, T]; the mask is a prefix of ones per row. The value past the
    last valid token is bootstrapped as 0. Returns ``(advantages, returns)``, both [B, T], with
    ``returns = advantages + values`` and 0 where mask is 0. Advantages are not whitened. No gradient.
    """
    mask = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        advantages[:, t] = next_adv
    return advantages, (advantages + values) * mask


@torch.no_grad()
def grpo_advantages(scores: Tensor, group_index: Tensor, eps: float = 1e-6, norm_by_std: bool = True) -> Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024): one scalar per sample.

    ``scores`` [B]: one reward per sample; ``group_index`` [B] long: equal ids answer the same prompt.
    Returns [B]: ``(score - group mean) / (group std + eps)`` with the unbiased std (as ``torch.std``),
    or just ``score - group mean`` when ``norm_by_std`` is False. A group of one gets advantage 0.
    """
    scores = scores if scores.is_floating_point() else scores.float()
    _, group, count = torch.unique(group_index, return_inverse=True, return_counts=True)
    count = count.to(scores.dtype)
    mean = torch.zeros_like(count).index_add_(0, group, scores) / count
    centred = scores - mean[group]
    if not norm_by_std:
        return centred
    sq = torch.zeros_like(count).index_add_(0, group, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp_min(1.0))
    return centred / (std[group] + eps)


def broadcast_to_tokens(per_sample: Tensor, mask: Tensor) -> Tensor:
    """Spread a per-sample value [B] over its response tokens: [B, T], 0 where mask is 0."""
    return per_sample[:, None] * mask.to(per_sample.dtype)


# --------------------------------------------------------------------------- KL and reward shaping


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || ref) estimate from sampled-token log-probs, [B, T] -> [B, T].

    ``"k1"``: ``logp - ref_logp`` (unbiased, can be negative). ``"k3"``: ``exp(r) - r - 1`` with
    ``r = ref_logp - logp`` clamped to [-20, 20] (Schulman's unbiased, low-variance, always >= 0).
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_ratio = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")


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


# --------------------------------------------------------------------------- losses


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO surrogate (Schulman et al. 2017), token-mean over the mask.

    All inputs [B, T]. Per token: ``max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c))`` with
    ``ratio = exp(logp - old_logp)`` (log-ratio clamped to [-20, 20]). Returns ``(loss scalar,
    metrics)``; metrics (detached scalars): ``clip_frac`` (share of tokens where the clipped term is
    taken), ``approx_kl`` (mean of ``old_logp - logp``), ``ratio_mean``.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).float(), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_range: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss, masked mean over tokens. All inputs [B, T].

    ``0.5 * max((v - R)^2, (clip(v, old - c, old + c) - R)^2)``. Returns ``(loss scalar,
    {"vf_clip_frac": share of tokens where the clipped term is taken})``.
    """
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        metrics = {"vf_clip_frac": masked_mean((clipped > unclipped).float(), mask)}
    return loss, metrics


# --------------------------------------------------------------------------- logits


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits), [..., V] -> [...], in float32: ``-sum p log p`` with ``log p`` from
    log_softmax (logsumexp of max-shifted logits), so large logits lose no precision to cancellation."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _label_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """Rows of logits [N, V] and labels [N] -> log p(label) [N], in float32."""
    logits = logits.float()
    return logits.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor, chunk_size: int = 0) -> Tensor:
    """Log-probability of each label: logits [B, T, V], labels [B, T] long -> [B, T] float32.

    With ``chunk_size > 0`` the B*T rows go through in chunks of ``chunk_size``, so at most one chunk's
    float32 copy of the logits exists at a time; under autograd each chunk is recomputed in backward
    (activation checkpointing) instead of keeping its float32 intermediates. Same values and gradients.
    """
    vocab = logits.shape[-1]
    rows, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    if chunk_size <= 0:
        return _label_logprobs(rows, flat_labels).reshape(labels.shape)
    fn = _label_logprobs
    if torch.is_grad_enabled() and logits.requires_grad:
        fn = partial(checkpoint, _label_logprobs, use_reentrant=False)
    chunks = [fn(x, y) for x, y in zip(rows.split(chunk_size), flat_labels.split(chunk_size))]
    return torch.cat(chunks).reshape(labels.shape)


# --------------------------------------------------------------------------- KL controllers


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
