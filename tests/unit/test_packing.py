"""Sequence packing (kuberl.training.packing) and token-budget micro-batches (kuberl.training.micro): the packed
row's layout by hand, and the packed forwards' log-probs, entropies, values and gradients against the padded
path's on the tiny model."""

from __future__ import annotations

import pytest
import torch

from kuberl.data.batch import Batch
from kuberl.spec.model import ModelSource
from kuberl.training.micro import map_rows, micro_rows, split_to, token_budget_groups
from kuberl.training.models import load_causal_lm, load_value_model
from kuberl.training.packing import pack, use_varlen
from kuberl.training.sequence import response_logprobs, response_values

P, R = 6, 8


def rows(seed: int = 0, b: int = 5) -> dict[str, torch.Tensor]:
    """b rows: left-padded prompts of 2..6 tokens, responses of 1..8 tokens (right-padded), one of each extreme."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 60, (b, P + R), generator=g)
    prompt_len = torch.tensor([6, 2, 4, 3, 5][:b])
    resp_len = torch.tensor([8, 1, 5, 3, 7][:b])
    pmask = (torch.arange(P)[None] >= P - prompt_len[:, None]).long()
    rmask = (torch.arange(R)[None] < resp_len[:, None]).float()
    ids[:, :P] = ids[:, :P] * pmask  # pad id 0 under the prompt's padding
    return {"input_ids": ids, "attention_mask": torch.cat([pmask, rmask.long()], 1), "responses": ids[:, P:],
            "response_mask": rmask}


def test_pack_lays_real_tokens_end_to_end_with_their_own_positions():
    ids = torch.tensor([[0, 7, 8, 9, 3], [5, 6, 1, 0, 0]])  # P=2, R=3: row 0 one pad, row 1 one response token
    am = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    rm = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    p = pack(ids, am, rm)
    assert p.input_ids.tolist() == [[7, 8, 9, 3, 5, 6, 1]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert p.cu_seqlens.tolist() == [0, 4, 7] and p.cu_seqlens.dtype == torch.int32 and p.max_len == 4
    assert p.source.tolist() == [0, 1, 2, 5]  # the positions that predict 8, 9, 3 and 1
    assert p.labels.tolist() == [8, 9, 3, 1]
    assert p.unpack(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [[1, 2, 3], [4, 0, 0]]


def test_pack_refuses_a_response_mask_outside_the_attention_mask():
    b = rows()
    attention = b["attention_mask"].clone()
    attention[0, P + 2] = 0  # row 0 trains on all 8 of its response tokens
    with pytest.raises(ValueError, match="inside the attention mask"):
        pack(b["input_ids"], attention, b["response_mask"])


@pytest.mark.parametrize("fused", [False, True])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_path(fused: bool):
    b = rows()
    padded = load_causal_lm(ModelSource(builtin="tiny"), seed=3)
    packed = load_causal_lm(ModelSource(builtin="tiny"), seed=3)
    use_varlen(packed)
    mask = b["response_mask"]
    out = {}
    for name, model, rmask in (("padded", padded, None), ("packed", packed, mask)):
        logp, ent = response_logprobs(model, b["input_ids"], b["attention_mask"], b["responses"], temperature=0.7,
                                      chunk_size=7, with_entropy=True, entropy_grad=True, fused=fused,
                                      response_mask=rmask)
        ((logp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        out[name] = (logp * mask, ent * mask, {n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(out["packed"][0], out["padded"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["packed"][1], out["padded"][1], rtol=1e-5, atol=1e-5)
    for name, grad in out["padded"][2].items():
        torch.testing.assert_close(out["packed"][2][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_values_equal_the_padded_values():
    b = rows(1)
    critic = load_value_model(ModelSource(builtin="tiny"), seed=2)
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # a zero head would make every value 0
    padded = response_values(critic, b["input_ids"], b["attention_mask"], R) * b["response_mask"]
    use_varlen(critic.trunk)
    packed = response_values(critic, b["input_ids"], b["attention_mask"], R, b["response_mask"])
    assert padded.abs().sum() > 0
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)


def test_a_varlen_model_still_runs_padded_batches_as_before():
    b = rows(2)
    plain, varlen = (load_causal_lm(ModelSource(builtin="tiny"), seed=1) for _ in range(2))
    use_varlen(varlen)
    one, two = (response_logprobs(m, b["input_ids"], b["attention_mask"], b["responses"])[0] for m in (plain, varlen))
    torch.testing.assert_close(two, one, rtol=0, atol=0)


def test_token_budget_groups_fit_first_fit_decreasing_and_a_long_row_goes_alone():
    assert token_budget_groups([5, 3, 9, 2, 4], budget=9) == [[0, 4], [1, 3], [2]]
    assert token_budget_groups([12, 1], budget=9) == [[0], [1]]
    assert token_budget_groups([], budget=9) == []


def test_split_to_halves_the_biggest_group_until_the_count():
    assert split_to([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="cannot make 3"):
        split_to([[0], [1]], 3)


def test_micro_rows_by_budget_and_map_rows_keep_the_batch_order():
    b = Batch(rows(3))
    lengths = b["attention_mask"].sum(1).tolist()  # 14, 3, 9, 6, 12
    groups = micro_rows(b, size=2, max_tokens=15)
    assert all(sum(lengths[i] for i in g.tolist()) <= 15 for g in groups)
    assert sorted(torch.cat(groups).tolist()) == list(range(5)) and len(groups) < 5
    assert [g.tolist() for g in micro_rows(b, size=2, max_tokens=None)] == [[0, 1], [2, 3], [4]]
    back = map_rows(b, groups, lambda mb: mb["input_ids"][:, :1] * 1)
    assert back[:, 0].tolist() == b["input_ids"][:, 0].tolist()


def test_a_sliding_window_model_is_refused_at_setup_not_at_its_first_packed_forward():
    from transformers import Qwen2ForCausalLM

    from kuberl.training.models import builtin_config

    model = Qwen2ForCausalLM(builtin_config("tiny", use_sliding_window=True, sliding_window=4, max_window_layers=0))
    with pytest.raises(ValueError, match="sliding-window attention layers.*spec.trainer.packing false"):
        use_varlen(model)
    # Mistral's window has no switch: a sliding_window set is one in use
    from transformers import MistralConfig, MistralForCausalLM

    mistral = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=4))
    with pytest.raises(ValueError, match="mistral has sliding-window attention layers"):
        use_varlen(mistral)


def test_a_row_with_no_prompt_token_is_refused_naming_the_field_and_the_fix():
    b = rows(2)
    b["attention_mask"][0, : b["attention_mask"].shape[1] - b["responses"].shape[1]] = 0  # row 0: no prompt token
    with pytest.raises(ValueError, match="^spec.trainer.packing: .*drop empty prompts from the dataset"):
        pack(b["input_ids"], b["attention_mask"], b["response_mask"])


def test_a_packed_micro_batch_with_nothing_to_predict_gives_zeros_and_still_backpropagates():
    b = rows(4)
    model = load_causal_lm(ModelSource(builtin="tiny"), seed=1)
    use_varlen(model)
    logp, ent = response_logprobs(model, b["input_ids"], b["attention_mask"], b["responses"], chunk_size=4,
                                  with_entropy=True, entropy_grad=True, fused=True,
                                  response_mask=torch.zeros_like(b["response_mask"]))
    assert logp.shape == ent.shape == b["responses"].shape and not logp.any() and not ent.any()
    (logp.sum() + ent.sum()).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_the_longest_sequence_is_bucketed_to_a_power_of_two():
    """The varlen kernel's max length is an upper bound, rounded up so compiled blocks see a few values, not each
    length (on an H100 each new exact length recompiled every block: 63 recompiles in one 0.5B update)."""
    from kuberl.training.packing import bucket

    assert [bucket(n) for n in (1, 2, 3, 4, 5, 627, 1024, 1025)] == [1, 2, 4, 4, 8, 1024, 1024, 2048]
    b = rows()
    assert pack(b["input_ids"], b["attention_mask"], b["response_mask"]).max_len == 16  # the longest is 14 tokens
