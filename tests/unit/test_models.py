"""Models and sequence helpers: the char tokenizer, seeded built-ins, value/reward heads, masks, log-probs."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from kuberl.spec.model import ModelSource
from kuberl.training.models import (
    builtin_config,
    char_tokenizer,
    count_params,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    load_value_model,
    transformer_blocks,
)
from kuberl.training.sequence import position_ids, response_logprobs, response_mask, response_values

TINY = ModelSource(builtin="tiny")


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def policy():
    return load_causal_lm(TINY).eval()


# -- tokenizer --------------------------------------------------------------------------------------


def test_char_tokenizer_round_trips_text(tok) -> None:
    text = "say c: 3+4=7, ok? #### 12.5 - done."
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces included
    assert tok.decode(ids) == text


def test_char_tokenizer_specials_and_unknowns(tok) -> None:
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    assert tok.unk_token_id not in tok("Hello, World! {x: [1]} \\ ~\n\t")["input_ids"]  # printable ASCII is known
    assert tok.decode([3, tok.eos_token_id, 0], skip_special_tokens=True) == "a"
    assert load_tokenizer(TINY) is tok


def test_unknown_characters_are_counted() -> None:
    from kuberl.training.vocab import unknown_characters

    assert unknown_characters(["café", "naïve é", "plain ASCII!"]) == {"é": 2, "ï": 1}


def test_char_tokenizer_left_pads(tok) -> None:
    enc = tok(["a", "say b:"], padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == (2, 6)
    assert enc["attention_mask"][0].tolist() == [0, 0, 0, 0, 0, 1]
    assert enc["input_ids"][0, :5].tolist() == [tok.pad_token_id] * 5
    assert enc["input_ids"][0, -1].item() == tok("a")["input_ids"][0]
    assert enc["attention_mask"][1].tolist() == [1] * 6


# -- built-in models --------------------------------------------------------------------------------


def test_builtin_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a = load_causal_lm(TINY, seed=0).state_dict()
    b = load_causal_lm(TINY, seed=0).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = load_causal_lm(TINY, seed=1).state_dict()
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"])


def test_builtin_config_matches_tokenizer(tok) -> None:
    cfg = builtin_config("tiny")
    assert cfg.vocab_size == len(tok) and cfg.pad_token_id == tok.pad_token_id and cfg.eos_token_id == tok.eos_token_id
    assert cfg.tie_word_embeddings


def test_transformer_blocks(policy) -> None:
    assert len(transformer_blocks(policy)) == builtin_config("tiny").num_hidden_layers
    assert len(transformer_blocks(load_value_model(TINY))) == builtin_config("tiny").num_hidden_layers
    assert transformer_blocks(torch.nn.Linear(2, 2)) == []


def test_value_model_shape(tok) -> None:
    critic = load_value_model(TINY)
    enc = tok(["say a:", "b"], padding=True, return_tensors="pt")
    values = critic(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert values.shape == enc["input_ids"].shape and values.dtype == torch.float32
    assert torch.count_nonzero(values) == 0  # the head starts at zero
    vals = response_values(critic, enc["input_ids"], enc["attention_mask"], resp_len=2)
    assert vals.shape == (2, 2)


def test_reward_model_logits_shape(tok) -> None:
    rm = load_reward_model(TINY).eval()
    enc = tok(["say a: aaaa", "b"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = rm(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    assert logits.shape == (2, 1)
    # left padding: the score of "b" is read at its last real token, not at a pad position
    with torch.no_grad():
        alone = rm(input_ids=enc["input_ids"][1:, -1:], attention_mask=enc["attention_mask"][1:, -1:]).logits
    torch.testing.assert_close(logits[1], alone[0], rtol=1e-4, atol=1e-5)


def test_count_params(policy) -> None:
    total = sum(p.numel() for p in policy.parameters())
    assert count_params(policy) == total  # tied embeddings are the LM head's matmul: counted
    assert count_params(policy, exclude_embeddings=False) == total
    cfg = builtin_config("tiny")
    cfg.tie_word_embeddings = False
    untied = Qwen2ForCausalLM(cfg)
    assert untied.lm_head.weight is not untied.get_input_embeddings().weight
    total_untied = sum(p.numel() for p in untied.parameters())
    assert count_params(untied) == total_untied - untied.get_input_embeddings().weight.numel()
    assert count_params(untied, exclude_embeddings=False) == total_untied


# -- sequence helpers -------------------------------------------------------------------------------


def test_response_mask_includes_eos_and_masks_after() -> None:
    eos = 1
    responses = torch.tensor([
        [5, 6, 1, 0, 0],   # eos then padding
        [5, 1, 7, 1, 0],   # tokens after the first eos are masked, even a second eos
        [5, 6, 7, 8, 9],   # no eos: all kept
        [1, 0, 0, 0, 0],   # eos first
    ])
    assert response_mask(responses, eos).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
    ]
    assert response_mask(responses, eos).dtype == torch.float32
    # pad == eos (hub tokenizers without a pad token): the first eos counts, the rest is padding
    assert response_mask(torch.tensor([[5, 2, 2, 2]]), eos_id=2).tolist() == [[1, 1, 0, 0]]
    # fixed-length rollouts pass eos_id=None: every token was drawn, the pad token's id (0 here) included
    assert response_mask(torch.tensor([[5, 1, 0]]), None).tolist() == [[1, 1, 1]]


def test_position_ids_skip_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    # left pads get 0; real tokens count from 0; masked tokens after the end (response padding)
    # repeat the last position, which is harmless because they are masked
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 2, 2]]


def manual_logprobs(model, input_ids, attention_mask, responses, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids(attention_mask)).logits
    r = responses.shape[1]
    pred = logits[:, -r - 1 : -1].float() / temperature  # position P+t-1 predicts response token t
    return torch.log_softmax(pred, dim=-1).gather(-1, responses[..., None]).squeeze(-1)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 0), (0.7, 0), (1.0, 3)])
def test_response_logprobs_matches_manual_log_softmax(policy, tok, temperature: float, chunk: int) -> None:
    prompts = tok(["say a:", "b"], padding=True, return_tensors="pt")
    responses = torch.tensor([[3, 3, 1, 0], [4, 5, 6, 7]])
    rmask = response_mask(responses, tok.eos_token_id)
    input_ids = torch.cat([prompts["input_ids"], responses], dim=1)
    attention_mask = torch.cat([prompts["attention_mask"], rmask.long()], dim=1)
    with torch.no_grad():
        logp, ent = response_logprobs(policy, input_ids, attention_mask, responses, temperature,
                                      chunk_size=chunk, with_entropy=True)
    want = manual_logprobs(policy, input_ids, attention_mask, responses, temperature)
    assert logp.shape == responses.shape and logp.dtype == torch.float32
    torch.testing.assert_close(logp, want, rtol=1e-5, atol=1e-5)
    assert ent is not None and ent.shape == responses.shape and bool((ent >= 0).all())
    assert bool((logp <= 0).all())


def test_response_logprobs_entropy_gradient_only_when_asked(policy, tok) -> None:
    enc = tok(["say a:"], return_tensors="pt")
    responses = torch.tensor([[3, 3]])
    ids = torch.cat([enc["input_ids"], responses], dim=1)
    mask = torch.ones_like(ids)
    logp, ent = response_logprobs(policy, ids, mask, responses, with_entropy=True)
    assert logp.requires_grad and not ent.requires_grad
    _, ent = response_logprobs(policy, ids, mask, responses, with_entropy=True, entropy_grad=True)
    assert ent.requires_grad
