"""kuberl.algos against hand-computed values (the arithmetic is in the comments) and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl import algos
from kuberl.spec.model import AlgorithmSpec

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --------------------------------------------------------------------------- masked statistics


def test_masked_sum_and_mean():
    x = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = T([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    close(algos.masked_sum(x, mask), 3.0)  # 1 + 2
    close(algos.masked_sum(x, mask, dim=0), [1.0, 2.0, 0.0])
    close(algos.masked_mean(x, mask), 1.5)  # (1 + 2) / 2
    close(algos.masked_mean(x, mask, dim=-1), [1.5, 0.0])  # empty row -> 0, not nan
    close(algos.masked_mean(x, mask.bool(), dim=1), [1.5, 0.0])  # bool mask works the same


def test_masked_mean_empty_mask_is_zero_with_finite_grad():
    x = torch.randn(2, 3, requires_grad=True)
    out = algos.masked_mean(x, torch.zeros(2, 3))
    out.backward()
    close(out, 0.0)
    close(x.grad, torch.zeros(2, 3))


def test_masked_mean_ignores_nonfinite_padding():
    x = T([[1.0, 3.0, float("nan"), float("inf")]], requires_grad=True)
    mask = T([[1, 1, 0, 0]])
    out = algos.masked_mean(x, mask)
    out.backward()
    close(out, 2.0)
    close(x.grad, [[0.5, 0.5, 0.0, 0.0]])  # d/dx of (x0 + x1) / 2


@pytest.mark.parametrize("mode, expected", [
    # rows of 3, 1 and 0 valid tokens (T = 4); 4 tokens and 2 sequences in the mini-batch on every rank together
    ("token-mean", [[1 / 4] * 3 + [0], [1 / 4, 0, 0, 0]]),
    ("seq-mean-token-mean", [[1 / 6] * 3 + [0], [1 / 2, 0, 0, 0]]),         # 1 / (2 sequences x its length)
    ("seq-mean-token-sum", [[1 / 2] * 3 + [0], [1 / 2, 0, 0, 0]]),
    ("seq-mean-token-sum-norm", [[1 / 8] * 3 + [0], [1 / 8, 0, 0, 0]]),     # 1 / (2 sequences x T)
])
def test_aggregation_weights(mode, expected):
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    w = algos.aggregation_weights(mask, mode, T(4.0), T(2.0))
    close(w, expected + [[0.0] * 4])
    x = T([[2.0, 4.0, 6.0, 99.0], [8.0, 99.0, 99.0, 99.0], [99.0] * 4])
    # the aggregated loss, sum(w * x): token-mean (2+4+6+8)/4 = 5; seq-mean-token-mean (4 + 8)/2 = 6;
    # seq-mean-token-sum (12 + 8)/2 = 10; seq-mean-token-sum-norm (12 + 8)/(2 x 4) = 2.5
    close(algos.masked_sum(x, w), {"token-mean": 5.0, "seq-mean-token-mean": 6.0, "seq-mean-token-sum": 10.0,
                                   "seq-mean-token-sum-norm": 2.5}[mode])


def test_overlong_penalty_by_hand():
    # max 16 tokens, buffer 4: free up to 12, then -penalty x (tokens past 12) / 4, the whole penalty at 16
    lengths = T([3, 12, 13, 14, 16, 20])
    close(algos.overlong_penalty(lengths, 16, 4, 1.0), [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    close(algos.overlong_penalty(lengths, 16, 4, 0.5), [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])


def test_masked_whiten():
    x = T([[1.0, 2.0, 3.0, 100.0]])
    mask = T([[1, 1, 1, 0]])
    # mean over valid = 2; unbiased var = ((1-2)^2 + 0 + (3-2)^2) / (3 - 1) = 1 -> std 1
    close(algos.masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]], atol=1e-6)
    close(algos.masked_whiten(x, mask, shift_mean=False), [[1.0, 2.0, 3.0, 0.0]], atol=1e-6)
    # scale: x = [0, 4] -> mean 2, var (4 + 4) / 1 = 8, std 2*sqrt(2) -> [-1/sqrt 2, 1/sqrt 2]
    r = 1 / math.sqrt(2)
    close(algos.masked_whiten(T([[0.0, 4.0]]), T([[1, 1]])), [[-r, r]], atol=1e-6)


# --------------------------------------------------------------------------- GAE


def test_gae_hand_computed():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    rewards = T([[1.0, 0.0, 2.0], [1.0, 2.0, 5.0]])
    values = T([[0.5, 1.0, 1.5], [0.5, 1.0, 9.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, ret = algos.gae_advantages(rewards, values, mask, gamma, lam)
    # row 0, all valid; value past the end = 0:
    #   d2 = 2 + 0.9*0   - 1.5 = 0.5    A2 = 0.5
    #   d1 = 0 + 0.9*1.5 - 1.0 = 0.35   A1 = 0.35 + 0.72*0.5  = 0.71
    #   d0 = 1 + 0.9*1.0 - 0.5 = 1.4    A0 = 1.4  + 0.72*0.71 = 1.9112
    #   returns = A + V = [2.4112, 1.71, 2.0]
    # row 1, last token is padding (its reward 5 and value 9 must be ignored):
    #   d1 = 2 + 0.9*0   - 1.0 = 1.0    A1 = 1.0
    #   d0 = 1 + 0.9*1.0 - 0.5 = 1.4    A0 = 1.4 + 0.72*1.0 = 2.12
    #   returns = [2.62, 2.0, 0]
    close(adv, [[1.9112, 0.71, 0.5], [2.12, 1.0, 0.0]], atol=1e-6)
    close(ret, [[2.4112, 1.71, 2.0], [2.62, 2.0, 0.0]], atol=1e-6)


def test_gae_monte_carlo_limit_and_edges():
    # gamma = lam = 1: A_t = (sum of rewards from t) - V_t; returns = reward-to-go.
    rewards = T([[1.0, 2.0, 3.0, 7.0], [0.0, 0.0, 0.0, 0.0]])
    values = T([[0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]])
    mask = T([[1, 1, 1, 0], [0, 0, 0, 0]]).bool()  # bool mask; row 1 is empty
    adv, ret = algos.gae_advantages(rewards, values, mask, 1.0, 1.0)
    close(ret, [[6.0, 5.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # 1+2+3, 2+3, 3
    close(adv, [[5.5, 4.5, 2.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert adv.shape == ret.shape == (2, 4)
    # lam = 0: one-step TD error  A_t = r_t + gamma*V_{t+1} - V_t
    adv, _ = algos.gae_advantages(T([[1.0, 1.0]]), T([[2.0, 4.0]]), T([[1, 1]]), 0.5, 0.0)
    close(adv, [[1 + 0.5 * 4 - 2, 1 + 0 - 4]])  # [1.0, -3.0]


def test_gae_skips_an_observation_inside_a_multi_turn_trajectory():
    # policy, observation, observation, policy: the observation's reward and value are ignored, and the first turn's
    # token sees the second's as its next step (it would see a bootstrapped 0 were the hole an end)
    gamma, lam = 0.9, 0.8
    rewards, values = T([[0.0, 5.0, 5.0, 2.0]]), T([[1.0, 9.0, 9.0, 1.5]])
    adv, ret = algos.gae_advantages(rewards, values, T([[1, 0, 0, 1]]), gamma, lam)
    #   A3 = 2 + 0 - 1.5 = 0.5;  d0 = 0 + 0.9*1.5 - 1 = 0.35;  A0 = 0.35 + 0.72*0.5 = 0.71
    close(adv, [[0.71, 0.0, 0.0, 0.5]], atol=1e-6)
    close(ret, [[1.71, 0.0, 0.0, 2.0]], atol=1e-6)
    # the same two tokens side by side give the same advantages
    packed, _ = algos.gae_advantages(T([[0.0, 2.0]]), T([[1.0, 1.5]]), T([[1, 1]]), gamma, lam)
    close(packed, [[0.71, 0.5]], atol=1e-6)


def test_reinforce_pp_return_to_go_skips_an_observation() -> None:
    # returns before whitening: G = [r0 + g*r3, 0, r3]; whitened over the two valid tokens they are -1 and +1 in order
    adv = algos.reinforce_pp_advantages(T([[3.0, 100.0, 1.0]]), T([[1, 0, 1]]), gamma=0.5)
    assert adv[0, 1] == 0 and adv[0, 0] > adv[0, 2]  # 3.5 > 1: the observation's 100 is not in the first's return
    close(adv[0, 0] + adv[0, 2], 0.0, atol=1e-6)


def test_gae_has_no_grad():
    values = torch.ones(1, 2, requires_grad=True)
    adv, ret = algos.gae_advantages(torch.ones(1, 2), values, torch.ones(1, 2), 1.0, 1.0)
    assert not adv.requires_grad and not ret.requires_grad


# --------------------------------------------------------------------------- GRPO


def test_grpo_two_groups_and_singleton():
    scores = T([1.0, 0.0, 2.0, 4.0, 3.0, 9.0])
    group = T([3, 7, 3, 7, 3, 5])  # ids need not be contiguous or sorted
    eps = 1e-6
    # group 3: [1, 2, 3]: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1] / (1 + eps)
    # group 7: [0, 4]:    mean 2, unbiased std sqrt((4 + 4) / 1) = 2*sqrt(2) -> -+ 2 / (2 sqrt 2 + eps)
    # group 5: [9]: a single answer -> 0
    s2 = 2 * math.sqrt(2)
    expected = [-1 / (1 + eps), -2 / (s2 + eps), 0.0, 2 / (s2 + eps), 1 / (1 + eps), 0.0]
    close(algos.grpo_advantages(scores, group, eps=eps), expected)
    close(algos.grpo_advantages(scores, group, norm_by_std=False), [-1.0, -2.0, 0.0, 2.0, 1.0, 0.0])


def test_drgrpo_estimator_centres_without_the_std():
    # Dr. GRPO: the same groups as above, score - group mean and no division, on every response token
    x = algos.AdvantageInputs(token_rewards=T([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0], [0.0, 4.0]]),
                              mask=T([[1, 1], [1, 0], [1, 1], [1, 1]]), group_index=T([3, 7, 3, 7]))
    adv, returns = algos.ADVANTAGE_ESTIMATORS.get("drgrpo")(x)
    # sequence rewards 1, 0, 2, 4: group 3 [1, 2] mean 1.5 -> -0.5, +0.5; group 7 [0, 4] mean 2 -> -2, +2
    close(adv, [[-0.5, -0.5], [-2.0, 0.0], [0.5, 0.5], [2.0, 2.0]])
    assert returns is None


def test_grpo_matches_torch_std_and_handles_ties():
    scores = torch.randn(12)
    group = torch.arange(3).repeat_interleave(4)
    adv = algos.grpo_advantages(scores, group, eps=0.0)
    g = scores.view(3, 4)
    close(adv, ((g - g.mean(1, keepdim=True)) / g.std(1, keepdim=True)).flatten(), atol=1e-5)
    # all answers equal -> std 0 -> advantage 0 (not nan)
    close(algos.grpo_advantages(T([0.5, 0.5, 0.5]), T([0, 0, 0])), [0.0, 0.0, 0.0])


def test_broadcast_to_tokens():
    out = algos.broadcast_to_tokens(T([2.0, -1.0]), T([[1, 1, 0], [1, 0, 0]]))
    close(out, [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])


# --------------------------------------------------------------------------- KL


def test_kl_estimators():
    logp = T([[-1.0, -2.0]])
    ref = T([[-1.5, -1.0]])
    close(algos.kl_penalty(logp, ref, "k1"), [[0.5, -1.0]])  # logp - ref
    # k3, r = ref - logp = [-0.5, 1.0]:
    #   exp(-0.5) + 0.5 - 1 = 0.60653066 - 0.5 = 0.10653066
    #   exp(1)    - 1   - 1 = 2.71828183 - 2   = 0.71828183
    close(algos.kl_penalty(logp, ref, "k3"), [[0.10653066, 0.71828183]])


def test_k3_is_nonnegative_and_clamped():
    logp = torch.randn(4, 8) * 3
    ref = torch.randn(4, 8) * 3
    assert (algos.kl_penalty(logp, ref, "k3") >= 0).all()
    close(algos.kl_penalty(logp, logp, "k3"), torch.zeros(4, 8))
    # r = -100 clamps to -20: exp(-20) + 20 - 1 = 19.000000002; r = +100 clamps to 20: exp(20) - 21
    out = algos.kl_penalty(T([[0.0, 0.0]], dtype=torch.float64), T([[-100.0, 100.0]], dtype=torch.float64), "k3")
    close(out, [[19.0 + math.exp(-20), math.exp(20) - 21]])


def test_unknown_kl_estimator():
    with pytest.raises(ValueError, match="k1, k3"):
        algos.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k9")


def test_token_rewards_placement():
    scores = T([2.0, -1.0, 5.0])
    mask = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    kl = T([[0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    # row 0: -0.1*kl on 3 valid tokens, score 2 on token 2: [-0.01, -0.02, -0.03 + 2, 0]
    # row 1: one valid token: -0.1*1.0 + (-1) = -1.1
    # row 2: no valid token: all 0 (the score has nowhere to go)
    expected = [[-0.01, -0.02, 1.97, 0.0], [-1.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    close(algos.token_rewards(scores, mask, kl, kl_coef=0.1), expected)
    close(algos.token_rewards(scores, mask.bool()), [[0, 0, 2.0, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0]])


# --------------------------------------------------------------------------- losses


def test_importance_ratio_to_the_behaviour_policy_by_hand():
    # one sample, three tokens; log-probs of the sampled tokens under the trained and the behaviour policy
    logp = T([[math.log(0.5), math.log(0.2), -30.0]])
    behaviour = T([[math.log(0.25), math.log(0.4), 0.0]])
    ratio, log_ratio = algos.importance_ratio(logp, behaviour)
    assert ratio.shape == log_ratio.shape == (1, 3)
    # t0: 0.5 / 0.25 = 2; t1: 0.2 / 0.4 = 0.5; t2: log ratio -30 is clamped to -20, ratio e^-20
    close(ratio, [[2.0, 0.5, math.exp(-20.0)]])
    close(log_ratio, [[math.log(2.0), math.log(0.5), -20.0]])
    same, zero = algos.importance_ratio(logp, logp)
    close(same, torch.ones(1, 3))
    close(zero, torch.zeros(1, 3))


def test_policy_loss_clipping():
    c = 0.2
    ratio = T([[1.5, 0.5, 0.5, 1.0, math.exp(5)]])
    adv = T([[1.0, 1.0, -2.0, 3.0, 100.0]])
    mask = T([[1, 1, 1, 1, 0]])
    old = torch.zeros(1, 5)
    logp = ratio.log().requires_grad_()
    loss, m = algos.policy_loss(logp, old, adv, mask, c)
    # per token max(-A*ratio, -A*clip(ratio, 0.8, 1.2)):
    #   t0: max(-1.5, -1.2) = -1.2  clipped
    #   t1: max(-0.5, -0.8) = -0.5
    #   t2: max( 1.0,  1.6) =  1.6  clipped
    #   t3: max(-3.0, -3.0) = -3.0
    #   t4: padding, ignored
    # loss = (-1.2 - 0.5 + 1.6 - 3.0) / 4 = -3.1 / 4 = -0.775; clip_frac = 2 / 4
    close(loss, -0.775)
    close(m["clip_frac"], 0.5)
    # approx_kl = mean(old - logp) = -(ln 1.5 + 2 ln 0.5 + 0) / 4 = -(0.4054651 - 1.3862944) / 4
    close(m["approx_kl"], 0.9808293 / 4)
    close(m["ratio_mean"], (1.5 + 0.5 + 0.5 + 1.0) / 4)  # 0.875
    loss.backward()
    # d/dlogp of -A*ratio/4 is -A*ratio/4 where unclipped; 0 where clipped or masked
    close(logp.grad, [[0.0, -0.125, 0.0, -0.75, 0.0]])
    assert all(not v.requires_grad for v in m.values())


def test_clip_higher_widens_only_the_upper_bound():
    # DAPO's clip-higher: clipLow 0.2, clipHigh 0.28 -> clip(ratio, 0.8, 1.28)
    algo = AlgorithmSpec(clip_ratio=0.2, clip_high=0.28)
    assert algo.clip_bounds == pytest.approx((0.8, 1.28))
    ratio, adv = T([[1.5, 1.25, 0.5]]), T([[1.0, 1.0, -1.0]])
    logp = ratio.log().requires_grad_()
    loss, m = algos.POLICY_LOSSES.get("clip")(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), algo)
    #   t0: max(-1.5, -1.28) = -1.28 clipped (at 1.2 with clipRatio alone)
    #   t1: max(-1.25, -1.28) = -1.25 unclipped (clipped at 1.2 with clipRatio alone)
    #   t2: max(0.5, 0.8) = 0.8 clipped at the unchanged lower bound
    close(loss, (-1.28 - 1.25 + 0.8) / 3)
    close(m["clip_frac"], 2 / 3)
    loss.backward()
    close(logp.grad, [[0.0, -1.25 / 3, 0.0]])
    assert AlgorithmSpec(clip_ratio=0.2, clip_low=0.1).clip_bounds == pytest.approx((0.9, 1.2))


def test_gspo_clips_whole_sequences_on_their_geometric_mean_ratio():
    algo = AlgorithmSpec(clip_ratio=0.2)
    # row 0: token log-ratios ln 2 and 0 (mask 1, 1) -> s = exp(ln 2 / 2) = sqrt 2 ~ 1.414 > 1.2: clipped whole
    # row 1: token log-ratios ln 1.1, ln 1.1 and a padded 5 -> s = 1.1: inside the range
    logp = T([[math.log(2.0), 0.0, 0.0], [math.log(1.1), math.log(1.1), 5.0]]).requires_grad_()
    old, mask = torch.zeros(2, 3), T([[1, 1, 0], [1, 1, 0]])
    adv = T([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    ratio, _ = algos.sequence_ratio(logp, old, mask)
    close(ratio[:, :2], [[math.sqrt(2.0)] * 2, [1.1, 1.1]])
    # weights in the mask (a loss aggregation, TIS) weigh the loss, not the geometric mean
    weighted, _ = algos.sequence_ratio(logp, old, mask * T([[0.3, 2.0, 0.0], [1.0, 0.1, 0.0]]))
    close(weighted, ratio)
    loss, m = algos.POLICY_LOSSES.get("gspo")(logp, old, adv, mask, algo)
    # token terms: row 0 max(-1.414, -1.2) = -1.2 (x2); row 1 max(2.2, 2.2) = 2.2 (x2) -> (-2.4 + 4.4) / 4 = 0.5
    close(loss, 0.5)
    close(m["clip_frac"], 0.5)
    loss.backward()
    # row 0 clipped: no gradient; row 1: d(-A * s * p / sg p)/d logp_t = -A * s / 4 = 2 * 1.1 / 4 per token
    close(logp.grad, [[0.0, 0.0, 0.0], [0.55, 0.55, 0.0]])


def test_tis_weights_by_hand():
    old = T([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    rollout = T([[math.log(0.5), math.log(0.3), math.log(0.4)]])
    # exp(old - rollout) = 1, 3, 0.5; capped at 2 -> 1, 2, 0.5; no gradient flows through them
    w = algos.tis_weights(old.requires_grad_(), rollout, cap=2.0)
    close(w, [[1.0, 2.0, 0.5]])
    assert not w.requires_grad


def test_policy_loss_on_policy_is_minus_mean_advantage():
    adv = torch.randn(3, 5)
    mask = torch.ones(3, 5)
    logp = torch.randn(3, 5)
    loss, m = algos.policy_loss(logp, logp, adv, mask, 0.2)
    close(loss, -adv.mean(), atol=1e-6)
    close(m["clip_frac"], 0.0)
    close(m["ratio_mean"], 1.0)


def test_value_loss_clipping():
    c = 0.2
    values = T([[1.0, 0.6, 0.0, 2.0, 50.0]], requires_grad=True)
    old = T([[0.5, 0.5, 0.5, 0.5, 0.0]])
    returns = T([[1.0, 1.0, -1.0, 0.0, 0.0]])
    mask = T([[1, 1, 1, 1, 0]])
    loss, m = algos.value_loss(values, old, returns, mask, c)
    # clip(v, old-0.2, old+0.2) and the two squared errors:
    #   t0: vc 0.7: (1-1)^2 = 0,      (0.7-1)^2 = 0.09  -> 0.09  clipped
    #   t1: vc 0.6: (0.6-1)^2 = 0.16, same              -> 0.16
    #   t2: vc 0.3: (0+1)^2 = 1,      (0.3+1)^2 = 1.69  -> 1.69  clipped
    #   t3: vc 0.7: (2-0)^2 = 4,      (0.7-0)^2 = 0.49  -> 4
    # loss = 0.5 * (0.09 + 0.16 + 1.69 + 4) / 4 = 0.5 * 5.94 / 4 = 0.7425
    close(loss, 0.7425)
    close(m["vf_clip_frac"], 0.5)
    loss.backward()
    # grad 0.5 * 2(v-R) / 4 = (v-R)/4 on unclipped tokens: t1: -0.4/4 = -0.1, t3: 2/4 = 0.5
    close(values.grad, [[0.0, -0.1, 0.0, 0.5, 0.0]])


# --------------------------------------------------------------------------- logits


def test_entropy():
    close(algos.entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    close(algos.entropy_from_logits(torch.full((7,), 1e4)), math.log(7))  # stable for large logits
    # p = [1/4, 3/4]: H = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351
    close(algos.entropy_from_logits(T([0.0, math.log(3)])), 0.5623351)
    assert algos.entropy_from_logits(torch.zeros(3, 5, dtype=torch.bfloat16)).dtype == torch.float32


def test_logprobs_hand_computed():
    logits = T([[[0.0, math.log(3)], [0.0, 0.0]]])
    labels = T([[1, 0]])
    # softmax([0, ln 3]) = [1/4, 3/4] -> ln 0.75 = -0.2876821; uniform pair -> ln 0.5
    close(algos.logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.5)]])


@pytest.mark.parametrize("chunk_size", [1, 3, 10, 64])
def test_chunked_logprobs_equal_unchunked(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    weights = torch.randn(2, 5, generator=g)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    full = algos.logprobs_from_logits(a, labels)
    chunked = algos.logprobs_from_logits(b, labels, chunk_size=chunk_size)
    close(chunked, full)
    close(full, torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1))
    (full * weights).sum().backward()
    (chunked * weights).sum().backward()
    close(b.grad, a.grad)
    with torch.no_grad():
        close(algos.logprobs_from_logits(logits, labels, chunk_size=chunk_size), full.detach())


def test_logprobs_bf16_computed_in_fp32():
    logits = (torch.randn(3, 4, 50) * 5).bfloat16().requires_grad_()
    labels = torch.randint(0, 50, (3, 4))
    out = algos.logprobs_from_logits(logits, labels, chunk_size=5)
    assert out.dtype == torch.float32
    expected = torch.log_softmax(logits.detach().float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    close(out, expected, atol=1e-5)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and logits.grad.shape == logits.shape


# --------------------------------------------------------------------------- KL controllers


def test_fixed_kl_controller():
    ctl = algos.make_kl_controller("fixed", 0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05
    ctl.load_state_dict({"value": 0.2})
    assert ctl.state_dict() == {"value": 0.2}


def test_adaptive_kl_controller_arithmetic():
    ctl = algos.make_kl_controller("adaptive", 0.1, target=6.0, horizon=10000)
    assert isinstance(ctl, algos.AdaptiveKLController)
    # kl 9: error 9/6 - 1 = 0.5, clipped to 0.2 -> 0.1 * (1 + 0.2 * 256/10000) = 0.1 * 1.00512 = 0.100512
    ctl.update(current_kl=9.0, n_steps=256)
    assert ctl.value == pytest.approx(0.100512)
    # kl 5.4: error 5.4/6 - 1 = -0.1 -> 0.100512 * (1 - 0.1 * 1000/10000) = 0.100512 * 0.99 = 0.09950688
    ctl.update(current_kl=5.4, n_steps=1000)
    assert ctl.value == pytest.approx(0.09950688)
    # kl 0: error -1 clipped to -0.2 -> * (1 - 0.2 * 5000/10000) = * 0.9
    ctl.update(current_kl=0.0, n_steps=5000)
    assert ctl.value == pytest.approx(0.09950688 * 0.9)
    restored = algos.make_kl_controller("adaptive", 1.0, target=6.0)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_make_kl_controller_errors():
    with pytest.raises(ValueError, match="target"):
        algos.make_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        algos.make_kl_controller("pid", 0.1)


def test_a_sample_kept_apart_leaves_its_groups_statistics_and_gets_no_advantage() -> None:
    # group 0: scores 1, 0 and a failed trajectory's 0; group 1: 0.5, 0.5. The failed one must not pull group 0's
    # mean to 1/3: its group is then as if it held 1 and 0 alone
    scores, groups = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 0, 1, 1])
    failed = torch.tensor([False, False, True, False, False])
    kept = algos.apart(groups, failed)
    assert kept[[0, 1, 3, 4]].tolist() == [0, 0, 1, 1] and int(kept[2]) not in (0, 1)
    for estimator in (algos.grpo_advantages, algos.rloo_advantages):
        adv = estimator(scores, kept)
        torch.testing.assert_close(adv[:2], estimator(scores[:2], groups[:2]))
        assert float(adv[2]) == 0.0
