"""Advantage estimators: pure functions, each registered by name (`ADVANTAGE_ESTIMATORS`).

An estimator takes `AdvantageInputs` and returns ``(advantages [B, T], returns [B, T] or None)``;
returns are the critic's regression targets (GAE only). The sequence reward of row b is
``token_rewards[b].sum()``: the score, plus the per-token KL penalty when the KL is in the reward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kuberl.registry import Registry
from kuberl.spec.model import ADVANTAGE_ESTIMATOR_NAMES

from .stats import masked_whiten


@dataclass(frozen=True)
class AdvantageInputs:
    token_rewards: Tensor  # [B, T]: the score on the last valid token, minus kl_coef * kl per token if shaped
    mask: Tensor  # [B, T] response mask
    group_index: Tensor  # [B] long: equal ids answer the same prompt
    values: Tensor | None = None  # [B, T] critic values (ppo)
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True  # spec.algorithm.normalizeAdvantages


AdvantageEstimator = Callable[[AdvantageInputs], tuple[Tensor, Tensor | None]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator", "spec.algorithm.advantageEstimator", ADVANTAGE_ESTIMATOR_NAMES)


@torch.no_grad()
def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over response tokens.

    ``rewards``, ``values``, ``mask``: [B, T]. The valid tokens of a row are its steps, one after another: a
    hole in the mask (an environment's observation inside a multi-turn trajectory) is skipped, not an end, so a
    turn's tokens see the rewards and values of the turns after it. The value past the last valid token is
    bootstrapped as 0. Returns ``(advantages, returns)``, both [B, T], with ``returns = advantages + values`` and 0
    where mask is 0. Advantages are not whitened. No gradient.
    """
    valid = mask.bool()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * next_adv
        next_adv = torch.where(valid[:, t], here, next_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(valid[:, t], here, 0.0)
    return advantages, (advantages + values) * mask.to(values.dtype)


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


def apart(group_index: Tensor, left_out: Tensor) -> Tensor:
    """``group_index`` [B] long with each sample where ``left_out`` [B] bool is set moved into a group of its own
    (new ids past the largest), so that the group statistics of GRPO and RLOO are the other samples' alone and a
    left-out sample's advantage is 0 (a trajectory whose environment failed)."""
    fresh = group_index.max() + 1 + torch.arange(len(group_index), device=group_index.device)
    return torch.where(left_out, fresh, group_index)


def broadcast_to_tokens(per_sample: Tensor, mask: Tensor) -> Tensor:
    """Spread a per-sample value [B] over its response tokens: [B, T], 0 where mask is 0."""
    return per_sample[:, None] * mask.to(per_sample.dtype)


@torch.no_grad()
def rloo_advantages(scores: Tensor, group_index: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): one scalar per sample, [B] -> [B].

    ``score_i - mean of the other scores of i's group`` = ``n / (n - 1) * (score_i - group mean)``
    for a group of n; a group of one gets 0.
    """
    scores = scores if scores.is_floating_point() else scores.float()
    _, group, count = torch.unique(group_index, return_inverse=True, return_counts=True)
    n = count.to(scores.dtype)
    total = torch.zeros_like(n).index_add_(0, group, scores)
    others = (n[group] - 1).clamp_min(1.0)
    return torch.where(n[group] > 1, scores - (total[group] - scores) / others, 0.0)


@torch.no_grad()
def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ (Hu et al. 2025): the discounted return-to-go of every token, whitened over all
    valid tokens of the batch (global normalisation, no critic). [B, T] -> [B, T], 0 where mask is 0.

    ``G_t = r_t + gamma * G_{t+1}`` over the valid tokens of a row, one after another (a hole in the mask, an
    observation inside a multi-turn trajectory, is skipped, as in `gae_advantages`).
    """
    valid = mask.bool()
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, 0.0)
    return masked_whiten(returns, mask)


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """GAE over the critic's values (whitened when `whiten`), and the critic's returns."""
    if x.values is None:
        raise ValueError("the gae advantage estimator needs critic values (spec.algorithm.name ppo)")
    adv, returns = gae_advantages(x.token_rewards, x.values, x.mask, x.gamma, x.lam)
    return (masked_whiten(adv, x.mask) if x.whiten else adv), returns


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """Group-normalised sequence rewards, on every token of the response."""
    return broadcast_to_tokens(grpo_advantages(x.token_rewards.sum(-1), x.group_index), x.mask), None


@ADVANTAGE_ESTIMATORS.register("drgrpo")
def drgrpo(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): the group-centred sequence reward,
    not divided by the group's std (which weights easy and hard prompts' groups unequally), on every token."""
    return broadcast_to_tokens(grpo_advantages(x.token_rewards.sum(-1), x.group_index, norm_by_std=False),
                               x.mask), None


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """Leave-one-out baselined sequence rewards, on every token of the response."""
    return broadcast_to_tokens(rloo_advantages(x.token_rewards.sum(-1), x.group_index), x.mask), None


@ADVANTAGE_ESTIMATORS.register("reinforce++")
def reinforce_pp(x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """Whitened returns-to-go of the token rewards."""
    return reinforce_pp_advantages(x.token_rewards, x.mask, x.gamma), None
