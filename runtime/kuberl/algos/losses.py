"""Policy losses (a registry) and the clipped value loss. All inputs [B, T]; losses are token means."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kuberl.registry import Registry
from kuberl.spec.model import POLICY_LOSS_NAMES, AlgorithmSpec

from .kl import LOG_RATIO_CLAMP
from .stats import masked_mean

# (logprobs, old_logprobs, advantages, mask, algorithm spec) -> (loss scalar, {metric: detached scalar}). The mask is
# 0/1, or, under a lossAggregation other than token-mean or with TIS, each response token's weight (> 0): the loss
# is then the weighted mean, as `masked_mean(x, mask)` computes it (the actor multiplies it by the weights' sum).
PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, AlgorithmSpec], tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "spec.algorithm.policyLoss", POLICY_LOSS_NAMES)


def importance_ratio(logprobs: Tensor, behaviour_logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token importance ratio of the policy being trained to the behaviour policy, the weights that
    generated the batch: ``ratio = pi_theta(a|s) / pi_behaviour(a|s) = exp(logp - behaviour_logp)``.

    Both inputs [B, T] (log-probs of the sampled tokens); returns ``(ratio [B, T], log_ratio [B, T])``
    with the log-ratio clamped to [-20, 20] first. On-policy the two are the same weights and the ratio
    is 1 at the first epoch; with spec.rollout.asynchronous the behaviour weights are one update older.
    """
    log_ratio = (logprobs - behaviour_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio), log_ratio


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_ratio: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO surrogate (Schulman et al. 2017), token-mean over the mask.

    All inputs [B, T]; ``old_logprobs`` are the behaviour policy's. Per token:
    ``max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c))`` with ``ratio`` from `importance_ratio`. Returns ``(loss
    scalar, metrics)``; metrics (detached scalars): ``clip_frac`` (share of tokens where the clipped term is
    taken), ``approx_kl`` (mean of ``old_logp - logp``), ``ratio_mean``.
    """
    ratio, log_ratio = importance_ratio(logprobs, old_logprobs)
    return _clipped(ratio, log_ratio, advantages, mask, (1.0 - clip_ratio, 1.0 + clip_ratio))


def _clipped(ratio: Tensor, log_ratio: Tensor, advantages: Tensor, mask: Tensor,
             bounds: tuple[float, float]) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-mean of ``max(-A * ratio, -A * clip(ratio, *bounds))`` and its metrics (`policy_loss`); all [B, T]."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(*bounds)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).float(), mask),
            "approx_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


def tis_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (Yao et al. 2025): per-token weights [B, T] = min(exp(old - rollout), cap),
    the trainer's behaviour log-probs over the rollout engine's for the same tokens (their numerics differ),
    with no gradient. Inputs [B, T]; the log-ratio clamped as in `importance_ratio`."""
    return torch.exp((old_logprobs - rollout_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=cap).detach()


def sequence_ratio(logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """GSPO's importance ratio (Zheng et al. 2025), one per sequence: the geometric mean of its token ratios,
    ``s_b = exp(mean_t(logp - behaviour_logp))`` over the mask, spread over the tokens as ``s_b * p / sg(p)``:
    each token's value is s_b and its gradient ``s_b * grad log p_t`` (sg: stop-gradient). Inputs [B, T];
    returns ``(ratio [B, T], token log-ratio [B, T])``, the log-ratios clamped as in `importance_ratio`."""
    _, log_ratio = importance_ratio(logprobs, behaviour_logprobs)
    seq = masked_mean(log_ratio, mask != 0, dim=-1)  # [B]; a weighted mask (aggregation, TIS) weighs no token here
    log_s = (logprobs - logprobs.detach() + seq.detach()[:, None]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_s), log_ratio


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


@POLICY_LOSSES.register("clip")
def clipped_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                        algo: AlgorithmSpec) -> tuple[Tensor, dict[str, Tensor]]:
    """`policy_loss` with the clip range of `spec.algorithm` (clipRatio, or clipLow and clipHigh)."""
    ratio, log_ratio = importance_ratio(logprobs, old_logprobs)
    return _clipped(ratio, log_ratio, advantages, mask, algo.clip_bounds)


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                     algo: AlgorithmSpec) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): the clipped surrogate on `sequence_ratio`, so a sequence is clipped whole,
    with the clip range of `spec.algorithm` (the paper's is far narrower than PPO's: clipLow 3e-4, clipHigh
    4e-4). Metrics as `policy_loss`; approx_kl from the token log-ratios."""
    ratio, log_ratio = sequence_ratio(logprobs, old_logprobs, mask)
    return _clipped(ratio, log_ratio, advantages, mask, algo.clip_bounds)


@POLICY_LOSSES.register("reinforce")
def reinforce_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                          algo: AlgorithmSpec) -> tuple[Tensor, dict[str, Tensor]]:
    """Unclipped policy gradient ``-A * ratio`` per token (token mean): on the rollout's own policy
    (ratio 1) its gradient is REINFORCE's ``-A * grad log p``. Metrics as `policy_loss` (clip_frac 0)."""
    ratio, log_ratio = importance_ratio(logprobs, old_logprobs)
    loss = masked_mean(-advantages * ratio, mask)
    with torch.no_grad():
        metrics = {"clip_frac": torch.zeros((), device=loss.device), "approx_kl": masked_mean(-log_ratio, mask),
                   "ratio_mean": masked_mean(ratio, mask)}
    return loss, metrics
