"""A multi-turn trajectory's tensors (kuberl.envs.trajectory) on a known, hand-written trajectory: exact responses,
loss mask, attention mask and rollout log-probs; the batch as response_batch lays out a single turn; and the
trainer's forward passes (padded and packed) reading it: observations are context, only policy tokens predicted."""

from __future__ import annotations

import pytest
import torch

from kuberl.envs.trajectory import build_trajectory, observation_turn, policy_turn, trajectory_batch
from kuberl.rollout import response_batch
from kuberl.spec.model import ModelSource
from kuberl.training.models import load_causal_lm
from kuberl.training.packing import pack, use_varlen
from kuberl.training.sequence import SEQ_KEYS, response_logprobs

PAD, EOS, PER_TURN = 0, 2, 4


def turns() -> list:
    """Three policy turns and two observations. Turn 1 ends at its EOS (the engine padded after it); turn 2 is cut
    at maxTokensPerTurn (4); turn 3 is a lone EOS."""
    return [policy_turn([21, 22, EOS, PAD], [-0.1, -0.2, -0.3, 0.0], EOS, PER_TURN),
            observation_turn([31, 32]),
            policy_turn([23, 24, 25, 26, 27, 28], [-0.4, -0.5, -0.6, -0.7, -9.0, -9.0], EOS, PER_TURN),
            observation_turn(torch.tensor([33])),
            policy_turn(torch.tensor([EOS]), torch.tensor([-0.8]), EOS, PER_TURN)]


def test_a_known_trajectory_gives_exact_tensors() -> None:
    t = build_trajectory([11, 12, 13], turns(), width=12, pad_id=PAD)
    #                        turn 1       obs 1    turn 2            obs 2 turn 3 pad
    assert t.responses.tolist() == [21, 22, EOS, 31, 32, 23, 24, 25, 26, 33, EOS, PAD]
    assert t.response_mask.tolist() == [1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 0]
    assert t.response_attention.tolist() == [1] * 11 + [0]
    assert t.attention_mask.tolist() == [1, 1, 1] + [1] * 11 + [0]
    assert t.input_ids.tolist() == [11, 12, 13, 21, 22, EOS, 31, 32, 23, 24, 25, 26, 33, EOS, PAD]
    torch.testing.assert_close(t.rollout_logprobs, torch.tensor(
        [-0.1, -0.2, -0.3, 0, 0, -0.4, -0.5, -0.6, -0.7, 0, -0.8, 0]), rtol=0, atol=0)
    assert t.turn_ends == (2, 8, 10) and not t.truncated
    assert t.responses.dtype == torch.long and t.response_mask.dtype == torch.float32
    assert t.attention_mask.dtype == torch.long and t.rollout_logprobs.dtype == torch.float32


def test_a_trajectory_longer_than_the_width_is_cut_and_marked_truncated() -> None:
    t = build_trajectory([11], turns(), width=6, pad_id=PAD)
    assert t.responses.tolist() == [21, 22, EOS, 31, 32, 23]
    assert t.response_mask.tolist() == [1, 1, 1, 0, 0, 1] and t.response_attention.tolist() == [1] * 6
    assert t.turn_ends == (2, 5) and t.truncated
    exact = build_trajectory([11], turns()[:2], width=5, pad_id=PAD)
    assert not exact.truncated and exact.response_attention.tolist() == [1] * 5


def test_a_policy_turn_is_cut_at_its_first_eos_or_at_max_tokens() -> None:
    assert policy_turn([5, EOS, 6, EOS], [-1, -2, -3, -4], EOS, 8).tokens.tolist() == [5, EOS]
    assert policy_turn([5, 6, 7, EOS], [-1, -2, -3, -4], EOS, 2).tokens.tolist() == [5, 6]  # EOS past the limit
    cut = policy_turn([5, 6, 7], [-1.0, -2.0, -3.0], None, None)
    assert cut.tokens.tolist() == [5, 6, 7] and cut.logprobs.tolist() == [-1.0, -2.0, -3.0] and cut.from_policy
    assert not observation_turn([1, 2]).from_policy
    with pytest.raises(ValueError, match="a policy turn of 3 tokens has 2 log-probs"):
        policy_turn([5, 6, 7], [-1.0, -2.0])


def test_the_batch_left_pads_prompts_and_stacks_responses() -> None:
    long = build_trajectory([11, 12, 13], turns(), width=12, pad_id=PAD)
    short = build_trajectory([14], [policy_turn([41, 42, 43, 44], [-1.0, -1.0, -1.0, -1.0], EOS, PER_TURN),
                                    observation_turn([51, 52, 53])], width=12, pad_id=PAD)
    b = trajectory_batch([long, short], pad_id=PAD)
    assert b["input_ids"].tolist() == [
        [11, 12, 13, 21, 22, EOS, 31, 32, 23, 24, 25, 26, 33, EOS, PAD],
        [PAD, PAD, 14, 41, 42, 43, 44, 51, 52, 53, PAD, PAD, PAD, PAD, PAD]]
    assert b["attention_mask"].tolist() == [[1] * 14 + [0], [0, 0] + [1] * 8 + [0] * 5]
    assert b["response_mask"].tolist() == [[1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1] + [0] * 8]
    assert b["rollout_logprobs"][1].tolist() == [-1.0] * 4 + [0.0] * 8
    assert b["responses"].shape == (2, 12) and b.meta == {"turn_ends": [(2, 8, 10), (3,)], "truncated": [False] * 2}
    assert trajectory_batch([short], PAD, prompt_width=3)["attention_mask"][0, :3].tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="does not fit prompt_width 2"):
        trajectory_batch([long], PAD, prompt_width=2)
    with pytest.raises(ValueError, match="different response widths"):
        trajectory_batch([long, build_trajectory([1], [], width=4, pad_id=PAD)], PAD)


def test_a_single_turn_trajectory_is_what_response_batch_makes() -> None:
    prompts, prompt_mask = torch.tensor([[PAD, 11, 12], [13, 14, 15]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    responses = torch.tensor([[21, 22, EOS, PAD, PAD], [23, 24, 25, 26, 27]])  # an engine's output, R = 5
    want = response_batch(prompts, prompt_mask, responses, EOS)
    got = trajectory_batch([build_trajectory(p[m.bool()], [policy_turn(r, torch.zeros(5), EOS)], 5, PAD)
                            for p, m, r in zip(prompts, prompt_mask, responses)], PAD)
    for key in SEQ_KEYS:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key


def test_the_trainer_reads_observations_as_context_and_predicts_policy_tokens_only() -> None:
    trajs = [build_trajectory([11, 12, 13], turns(), width=12, pad_id=PAD),
             build_trajectory([14], [policy_turn([41, 42, 43], [-1.0] * 3, EOS, PER_TURN), observation_turn([51]),
                                     policy_turn([44, EOS], [-1.0] * 2, EOS, PER_TURN)], width=12, pad_id=PAD)]
    b = trajectory_batch(trajs, PAD)
    ids, attention, responses, mask = (b[k] for k in ("input_ids", "attention_mask", "responses", "response_mask"))
    packed = pack(ids, attention, mask)
    assert packed.labels.tolist() == [21, 22, EOS, 23, 24, 25, 26, EOS, 41, 42, 43, 44, EOS]  # no observation token
    assert packed.input_ids[0].tolist() == [t for row, a in zip(ids.tolist(), attention.tolist())
                                            for t, keep in zip(row, a) if keep]  # observations are in the context

    model = load_causal_lm(ModelSource(builtin="tiny"), seed=5)
    padded_logp, _ = response_logprobs(model, ids, attention, responses)
    with torch.no_grad():  # each row alone, unpadded: log p of every next token
        for row, t in enumerate(trajs):
            real = t.input_ids[t.attention_mask.bool()][None]
            logits = model(input_ids=real).logits[0, :-1].log_softmax(-1)
            alone = logits.gather(1, real[0, 1:, None])[:, 0][t.prompt.numel() - 1:]
            n = alone.numel()
            torch.testing.assert_close(padded_logp[row, :n] * mask[row, :n], alone * mask[row, :n], rtol=1e-5,
                                       atol=1e-5)
    varlen = load_causal_lm(ModelSource(builtin="tiny"), seed=5)
    use_varlen(varlen)
    packed_logp, _ = response_logprobs(varlen, ids, attention, responses, response_mask=mask)
    torch.testing.assert_close(packed_logp, padded_logp * mask, rtol=1e-5, atol=1e-5)
    assert bool((packed_logp[mask == 0] == 0).all()) and bool((packed_logp[mask == 1] != 0).all())
