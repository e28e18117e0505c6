"""RL algorithms as pure torch functions: masked statistics, advantage estimators, KL, losses, KL controllers.

Conventions: ``B`` is the batch (samples), ``T`` the response length, ``V`` the vocabulary. A ``mask``
is 1 (or True) on real response tokens and 0 on padding / after EOS; it may be float or bool.
Nothing here touches torch.distributed: statistics are over the local batch only. Advantage
estimators, policy losses and KL estimators are registries (`kuberl.registry`): a spec names a
built-in or a user function by import path.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    apart,
    broadcast_to_tokens,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .kl import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty, make_kl_controller, token_rewards
from .logits import entropy_from_logits, logprobs_from_logits
from .losses import POLICY_LOSSES, importance_ratio, policy_loss, sequence_ratio, tis_weights, value_loss
from .shaping import overlong_penalty
from .stats import aggregation_weights, masked_mean, masked_sum, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "POLICY_LOSSES", "AdaptiveKLController", "AdvantageInputs", "apart",
    "aggregation_weights", "overlong_penalty",
    "FixedKLController", "broadcast_to_tokens", "entropy_from_logits", "gae_advantages", "grpo_advantages",
    "importance_ratio", "kl_penalty", "logprobs_from_logits", "make_kl_controller", "masked_mean", "masked_sum",
    "masked_whiten",
    "policy_loss", "reinforce_pp_advantages", "rloo_advantages", "sequence_ratio", "tis_weights", "token_rewards",
    "value_loss",
]
