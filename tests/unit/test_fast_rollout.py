"""The fast `hf` rollout path (static KV cache decoder, its sampler) and the fused LM-head log-probs, on CPU.

On CPU the decoder runs its decode step eagerly (CUDA graphs and the flash kernel need a GPU: tests/gpu/
covers them), so these tests check the logic that the captured graph replays: the functional forward
over fused weights, the left-aligned cache and its lengths, left padding, EOS then pad, the sampler
(Gumbel-max over hashed noise, the sort-free nucleus), and in-place weight sync. The flash decode call
is checked against FlashAttention's documented varlen contract through a CPU stand-in for the kernel.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kuberl.rollout import fast, response_batch
from kuberl.rollout.fast import SamplingParams, StaticDecoder, unsupported_reason
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.sampling import _nucleus, gumbel, nucleus_rounds, sample
from kuberl.spec import JobSpec
from kuberl.training.kernels.lm_head import linear_logprobs
from kuberl.training.models import char_tokenizer
from kuberl.training.sequence import response_logprobs

PAD, EOS, VOCAB = 0, 1, 50


def small_lm(kind: str = "qwen2", seed: int = 0) -> torch.nn.Module:
    """A small model with large init, so greedy decoding is not degenerate and EOS does occur."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.4, pad_token_id=PAD,
              eos_token_id=EOS, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(Qwen2Config(**kw)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**kw))
    return model.eval()


def prompts(batch: int = 6, length: int = 9, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: row i has i pad tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(batch):
        ids[i, :i], mask[i, :i] = PAD, 0
    return ids, mask


def hf_greedy(model, ids, mask, new_tokens: int) -> torch.Tensor:
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                         pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    return torch.nn.functional.pad(out, (0, new_tokens - out.shape[1]), value=PAD)


def key(seed: int = 0, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([seed]), torch.tensor([step])


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_greedy_is_token_identical_to_transformers_generate(kind: str) -> None:
    model = small_lm(kind)
    ids, mask = prompts()
    ours = StaticDecoder(model, PAD, EOS).generate(ids, mask, 30, SamplingParams(greedy=True))
    want = hf_greedy(model, ids, mask, 30)
    assert torch.equal(ours, want)
    assert bool((want == EOS).any()), "the check should cover a sequence that ends early"


def test_fused_projections_are_views_the_model_and_weight_sync_write_through() -> None:
    """QKV and gate/up are each one tensor; the HF parameters are row slices of them (same names in
    state_dict), a copy_ into a parameter lands in the fused tensor, and a second decoder re-fuses nothing."""
    model = small_lm()
    keys = list(model.state_dict())
    dec = StaticDecoder(model, PAD, EOS)
    assert list(model.state_dict()) == keys
    attn, mlp, w = model.model.layers[1].self_attn, model.model.layers[1].mlp, dec.layers[1]
    assert w.wqkv.shape == (64 + 2 * 32, 64) and w.bqkv.shape == (64 + 2 * 32,) and w.wgu.shape == (256, 64)
    assert attn.q_proj.weight.data_ptr() == w.wqkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == w.wqkv[96:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == w.wgu[128:].data_ptr()
    with torch.no_grad():
        attn.k_proj.weight.copy_(torch.full_like(attn.k_proj.weight, 0.25))
    assert bool((w.wqkv[64:96] == 0.25).all())
    ptrs = [p.data_ptr() for p in model.parameters()]
    again = StaticDecoder(model, PAD, EOS)
    assert [p.data_ptr() for p in model.parameters()] == ptrs and again.layers[1].wqkv.data_ptr() == w.wqkv.data_ptr()


def test_eos_is_followed_by_pad_only() -> None:
    model = small_lm()
    ids, mask = prompts(batch=16)
    torch.manual_seed(3)
    out = StaticDecoder(model, PAD, EOS).generate(ids, mask, 40, SamplingParams())
    ended = 0
    for row in out.tolist():
        if EOS in row:
            ended += 1
            assert all(t == PAD for t in row[row.index(EOS) + 1:])
    assert ended > 0


def test_fixed_length_never_draws_eos() -> None:
    dec = StaticDecoder(small_lm(), PAD, EOS)
    out = dec.generate(*prompts(batch=16), 40, SamplingParams(suppress_eos=True))
    assert not bool((out == EOS).any()) and not bool(dec._state.finished.any())


def test_tiny_top_p_is_greedy_and_seed_reproduces() -> None:
    model = small_lm()
    dec = StaticDecoder(model, PAD, EOS)
    ids, mask = prompts()
    greedy = dec.generate(ids, mask, 20, SamplingParams(greedy=True))
    assert torch.equal(dec.generate(ids, mask, 20, SamplingParams(top_p=1e-9)), greedy)
    torch.manual_seed(7)
    a = dec.generate(ids, mask, 20, SamplingParams(temperature=0.8, top_p=0.9))
    torch.manual_seed(7)
    b = dec.generate(ids, mask, 20, SamplingParams(temperature=0.8, top_p=0.9))
    torch.manual_seed(8)
    c = dec.generate(ids, mask, 20, SamplingParams(temperature=0.8, top_p=0.9))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_repeated_prompts_get_different_samples() -> None:
    """GRPO repeats each prompt: the noise differs per row, so the copies are not one response n times."""
    ids, mask = prompts(batch=1)
    out = StaticDecoder(small_lm(), PAD, EOS).generate(ids.repeat(8, 1), mask.repeat(8, 1), 12, SamplingParams())
    assert len({tuple(r) for r in out.tolist()}) > 4


# --------------------------------------------------------------------------- the sampler


def test_sampling_draws_from_softmax_with_temperature_and_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).repeat(40000, 1)
    t = 0.7
    tokens, unresolved = sample(logits, SamplingParams(temperature=t), None, *key(0))
    freq = torch.bincount(tokens, minlength=5).float() / len(logits)
    assert unresolved is None and torch.allclose(freq, torch.softmax(logits[0] / t, -1), atol=0.01)
    # top_p=0.8: the smallest prefix (by probability) whose mass reaches 0.8, renormalised
    p = torch.softmax(logits[0], -1)
    keep = (p.cumsum(-1) - p) < 0.8
    want = torch.where(keep, p, 0.0) / p[keep].sum()
    tokens, unresolved = sample(logits, SamplingParams(top_p=0.8), None, *key(1))
    freq = torch.bincount(tokens, minlength=5).float() / len(logits)
    assert torch.allclose(freq, want, atol=0.01) and float(freq[~keep].sum()) == 0.0
    assert int(unresolved.sum()) == 0


@pytest.mark.parametrize("scale", [0.6, 3.0])
def test_nucleus_matches_the_sorted_definition_on_a_large_vocabulary(scale: float) -> None:
    """Near-uniform (a random-init model's logits) and peaked rows: every draw lies in the nucleus
    computed by sorting, and the draws follow the renormalised nucleus distribution (checked on eight
    groups of consecutive ranks, each within 4 standard deviations)."""
    g = torch.Generator().manual_seed(2)
    vocab, top_p, n = 2048, 0.9, 4000
    row = torch.randn(vocab, generator=g) * scale
    probs = torch.softmax(row, -1)
    order = probs.argsort(descending=True)
    above = probs[order].cumsum(-1) - probs[order]
    inside = int((above < top_p).sum())
    nucleus = torch.zeros(vocab, dtype=torch.bool)
    nucleus[order[:inside]] = True
    tokens, unresolved = sample(row.repeat(n, 1), SamplingParams(top_p=top_p), None, *key(3))
    assert bool(nucleus[tokens].all()) and int(unresolved.sum()) == 0
    rank = torch.empty(vocab, dtype=torch.long)
    rank[order] = torch.arange(vocab)
    groups = torch.linspace(0, inside, 9).long()
    want = probs[order[:inside]] / probs[order[:inside]].sum()
    for lo, hi in zip(groups[:-1], groups[1:]):
        expected = float(want[lo:hi].sum())
        seen = float(((rank[tokens] >= lo) & (rank[tokens] < hi)).float().mean())
        assert abs(seen - expected) < 4 * math.sqrt(expected * (1 - expected) / n) + 1e-4, (int(lo), seen, expected)


def test_nucleus_ties_at_the_edge_are_all_in_or_all_out_and_eos_can_be_suppressed() -> None:
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, -2.0]]).repeat(4000, 1)
    p = torch.softmax(logits[0], -1)  # p0 ~ 0.78: with top_p 0.9 the three tied tokens are all needed
    tokens, _ = sample(logits, SamplingParams(top_p=0.9), None, *key(4))
    assert set(tokens.tolist()) == {0, 1, 2, 3} and float(p[0]) < 0.9
    tokens, _ = sample(logits, SamplingParams(top_p=float(p[0]) - 1e-4), None, *key(5))
    assert set(tokens.tolist()) == {0}
    tokens, _ = sample(logits, SamplingParams(top_p=0.95, suppress_eos=True), 0, *key(6))
    assert 0 not in set(tokens.tolist()) and set(tokens.tolist()) <= {1, 2, 3, 4}


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_suppressed_eos_is_never_drawn_where_the_noise_is_infinite(top_p: float) -> None:
    """The hashed noise is +inf where its uniform rounds to 1.0 (one input in 2^24; more with a GPU's fast log):
    key (2, 0) puts one at column 10,294,895. Made EOS there, a suppressed EOS (-inf + inf = NaN) was drawn."""
    col = 10_294_895
    assert torch.isinf(gumbel(*key(2), 1, col + 1)[0, col])
    logits = torch.zeros(1, col + 1)
    tokens, _ = sample(logits, SamplingParams(top_p=top_p, suppress_eos=True), col, *key(2))
    assert int(tokens) != col
    tokens, _ = sample(logits, SamplingParams(top_p=top_p), col, *key(2))
    assert int(tokens) == col  # not suppressed, it is the draw: the case above is the one that matters


def test_unresolved_draws_take_the_most_likely_token_and_are_reported() -> None:
    """With a single check, rows whose first candidate lies outside the nucleus are unresolved: they take
    the most likely token and are flagged (about 1 - top_p of them)."""
    g = torch.Generator().manual_seed(9)
    lv = torch.randn(20000, 64, generator=g)
    noise = gumbel(*key(11), 20000, 64)
    tokens, unresolved = _nucleus(lv, lv, lv + noise, 0.9, rounds=1)
    assert abs(float(unresolved.float().mean()) - 0.1) < 0.01
    assert torch.equal(tokens[unresolved], lv[unresolved].argmax(-1))
    tokens, unresolved = _nucleus(lv, lv, lv + noise, 0.9, rounds=nucleus_rounds(0.9))
    assert int(unresolved.sum()) == 0


def test_nucleus_rounds_follow_the_unresolved_probability_of_the_search() -> None:
    """The closed form P * sum_{j>=k} (-ln P)^j / j! against the exact probability of the search on a
    long-tailed distribution (dynamic programming over the tail ranks)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(20000, generator=g, dtype=torch.float64) * 0.6, -1).sort(descending=True).values
    for top_p in (0.5, 0.9, 0.99):
        cum = probs.cumsum(0)
        n = int(((cum - probs) < top_p).sum())
        fail = torch.ones(len(probs) + 1, dtype=torch.float64)  # P(unresolved in k more checks | window of m tokens)
        closed = 1.0
        lam, term = -math.log(top_p), top_p
        for k in range(1, 6):
            pref = torch.cat([torch.zeros(1, dtype=torch.float64), (probs[n:] * fail[n:-1]).cumsum(0)])
            nxt = torch.zeros_like(fail)
            m = torch.arange(n + 1, len(probs) + 1)
            nxt[n + 1:] = pref[m - n] / cum[m - 1]
            fail = nxt
            closed -= term
            term *= lam / k
            assert abs(float(fail[-1]) - closed) < 0.02 * closed + 1e-9, (top_p, k)
    assert [nucleus_rounds(p) for p in (0.5, 0.9, 0.95, 0.99)] == [8, 5, 4, 3]


def test_hashed_noise_is_uniform_independent_and_keyed() -> None:
    u = torch.exp(-torch.exp(-gumbel(*key(123, 7), 512, 512)))  # back to the uniform
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.003
    flat = u.flatten() - 0.5
    for lag in (1, 512):  # neighbouring columns and rows
        assert abs(float((flat[:-lag] * flat[lag:]).mean()) * 12) < 0.01
    other = torch.exp(-torch.exp(-gumbel(*key(123, 8), 512, 512)))  # next step
    assert abs(float(((u - 0.5) * (other - 0.5)).mean()) * 12) < 0.01
    assert torch.equal(gumbel(*key(123, 7), 512, 512), gumbel(*key(123, 7), 512, 512))
    assert not torch.equal(gumbel(*key(124, 7), 4, 4), gumbel(*key(123, 7), 4, 4))


# --------------------------------------------------------------------------- the decode attention call


def _flash_varlen_reference(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale=None, seqused_k=None,
                            **_):
    """FlashAttention-2 varlen forward as documented: sequence b's queries are rows cu_q[b]:cu_q[b+1], its
    keys rows cu_k[b] .. cu_k[b] + seqused_k[b]; query head i reads KV head i // (heads / kv_heads)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b]) + int(seqused_k[b]))
        keys, values = k[ks].repeat_interleave(group, 1), v[ks].repeat_interleave(group, 1)
        att = torch.einsum("qhd,khd->hqk", q[qs].float(), keys.float()) * scale
        out[qs] = torch.einsum("hqk,khd->qhd", att.softmax(-1), values.float()).to(q.dtype)
    return out, None, None, None, None


def test_flash_decode_call_matches_sdpa_under_the_varlen_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", _flash_varlen_reference)
    b, s, h, kv, d = 3, 32, 8, 2, 16
    q, k, v = torch.randn(b, h, d), torch.randn(b * s, kv, d), torch.randn(b * s, kv, d)
    used = torch.tensor([1, 32, 9], dtype=torch.int32)
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    bias = torch.where(torch.arange(s)[None] < used[:, None], 0.0, float("-inf"))[:, None, None]
    got = fast.flash_decode(q, k, v, cu_q, cu_q * s, used, s, 0.25)
    torch.testing.assert_close(got, fast.sdpa_decode(q, k, v, bias, s, 0.25))


def test_decoder_with_the_flash_call_gives_the_same_greedy_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder's per-step buffers (cu_q, cu_k, used) drive the flash call correctly (CPU stand-in)."""
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", _flash_varlen_reference)
    model = small_lm()
    ids, mask = prompts()
    dec = StaticDecoder(model, PAD, EOS)
    assert dec.attention == "sdpa" and "not on CUDA" in dec.attention_note
    dec.attention = "flash"
    assert torch.equal(dec.generate(ids, mask, 30, SamplingParams(greedy=True)), hf_greedy(model, ids, mask, 30))


def test_one_state_serves_prompts_of_nearby_lengths() -> None:
    """Prompts are left-padded to a multiple of 16: lengths 9 and 12 share one captured shape."""
    model = small_lm()
    dec = StaticDecoder(model, PAD, EOS)
    for length in (9, 12):
        ids, mask = prompts(length=length)
        assert torch.equal(dec.generate(ids, mask, 10, SamplingParams(greedy=True)), hf_greedy(model, ids, mask, 10))
        assert dec._state.prompt_len == 16


def spec(**rollout) -> JobSpec:
    return JobSpec.model_validate({"data": {"task": "repeat-letter"},
                                   "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                                   "rollout": {"maxNewTokens": 12, **rollout}})


def test_hf_engine_weight_sync_is_in_place_and_changes_output() -> None:
    tok = char_tokenizer()
    engine = HFRollout(spec(), torch.device("cpu"), torch.float32, tok, fast=True)
    assert engine.path == "static-eager"
    ptrs = {k: p.data_ptr() for k, p in engine.model.named_parameters()}
    enc = tok(["say a:", "3+4="], padding=True, return_tensors="pt")
    before = engine.fast.generate(enc["input_ids"], enc["attention_mask"], 12, SamplingParams(greedy=True))
    torch.manual_seed(5)
    new = {k: torch.randn_like(v) * 0.5 for k, v in engine.model.state_dict().items()}
    engine.load_weights(new)
    assert {k: p.data_ptr() for k, p in engine.model.named_parameters()} == ptrs
    after = engine.fast.generate(enc["input_ids"], enc["attention_mask"], 12, SamplingParams(greedy=True))
    want = hf_greedy(engine.model, enc["input_ids"], enc["attention_mask"], 12)
    assert torch.equal(after, want) and not torch.equal(before, after)


def reseeding_meanwhile(call: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`call()` while another thread keeps reseeding and drawing from torch's global generator (what an
    update beside an asynchronous rollout could do in the actor's process)."""
    stop = threading.Event()

    def noise() -> None:
        while not stop.is_set():
            torch.manual_seed(0)
            torch.rand(64)

    thread = threading.Thread(target=noise)
    thread.start()
    try:
        return call()
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("fast_path", [False, True], ids=["generate", "static-eager"])
def test_hf_engine_rollout_logprobs_are_the_trainers_for_the_same_tokens(fast_path: bool) -> None:
    """Each path gives the log-prob of every token it drew, at the rollout's temperature, before top-p, 0 past a
    response's end; on the CPU in fp32 they equal the trainer's full forward's for the same tokens."""
    tok = char_tokenizer()
    engine = HFRollout(spec(temperature=0.7, topP=0.9), torch.device("cpu"), torch.float32, tok, fast=fast_path)
    enc = tok(["say a:", "3+4=", "say q:", "x"] * 8, padding=True, return_tensors="pt")  # some end at an EOS
    responses = engine.generate(enc["input_ids"], enc["attention_mask"], seed=5)
    got = engine.rollout_logprobs()
    batch = response_batch(enc["input_ids"], enc["attention_mask"], responses, tok.eos_token_id)
    want, _ = response_logprobs(engine.model, batch["input_ids"], batch["attention_mask"], responses, 0.7)
    mask = batch["response_mask"].bool()
    assert got.shape == responses.shape and bool((~mask).any()), "the check needs a response that ends early"
    assert not bool(got[~mask].any())
    torch.testing.assert_close(got[mask], want[mask], atol=2e-4, rtol=0)
    assert float(got[mask].max()) <= 0.0 and bool((got[mask] < -1e-3).any())


@pytest.mark.parametrize("fast_path", [False, True], ids=["generate", "static-eager"])
def test_hf_engine_draws_from_its_own_generator(fast_path: bool) -> None:
    """The engine's sampling never touches torch's global generator (the state is the same after a call, and a
    thread reseeding it meanwhile changes no token), and gives the tokens it gave when it seeded the global
    generator: torch.manual_seed(seed) then transformers' sampling (or the fast decoder's global draw)."""
    tok = char_tokenizer()
    engine = HFRollout(spec(temperature=0.7, topP=0.9), torch.device("cpu"), torch.float32, tok, fast=fast_path)
    with torch.no_grad():
        for p in engine.model.parameters():  # peaked enough that temperature and top-p cut tokens
            p.mul_(20.0)
    enc = tok(["say a:", "3+4=", "say q:", "x"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    torch.manual_seed(123)
    state = torch.get_rng_state()
    out = engine.generate(ids, mask, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(7)
    if fast_path:
        before = engine.fast.generate(ids, mask, 12, engine.sampling())
    else:
        full = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_p=0.9,
                                     top_k=0, max_new_tokens=12, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id)[:, ids.shape[1]:]
        before = torch.cat([full, full.new_full((len(full), 12 - full.shape[1]), tok.pad_token_id)], dim=1)
    assert torch.equal(out, before)
    assert torch.equal(reseeding_meanwhile(lambda: engine.generate(ids, mask, seed=7)), out)
    assert not torch.equal(engine.generate(ids, mask, seed=8), out)


def test_cpu_default_is_transformers_generate() -> None:
    tok = char_tokenizer()
    assert HFRollout(spec(), torch.device("cpu"), torch.float32, tok).path == "generate"
    assert HFRollout(spec(compile=True), torch.device("cpu"), torch.float32, tok).path == "generate"


def test_unsupported_architecture_is_named_and_falls_back() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB))
    assert "gpt2" in unsupported_reason(gpt2)
    with pytest.raises(ValueError, match="does not support"):
        StaticDecoder(gpt2, PAD, EOS)


# --------------------------------------------------------------------------- fused LM head + log-softmax


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [3, 0])
def test_linear_logprobs_values_and_gradients(temperature: float, chunk: int) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 40, (2, 5))
    logp, ent = linear_logprobs(hidden, weight, labels, temperature, chunk, with_entropy=True, entropy_grad=True)
    logits = hidden @ weight.T / temperature
    ref_lp = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(logp, ref_lp.float())
    torch.testing.assert_close(ent, ref_ent.float())
    assert logp.dtype == torch.float32
    # gradients through log p and the entropy, against autograd on the plain formula
    w1, w2 = torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    gh, gw = torch.autograd.grad((logp.double() * w1).sum() + (ent.double() * w2).sum(), (hidden, weight))
    rh, rw = torch.autograd.grad((ref_lp * w1).sum() + (ref_ent * w2).sum(), (hidden, weight))
    torch.testing.assert_close(gh, rh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-6)


def test_linear_logprobs_entropy_without_grad_leaves_gradient_to_logp() -> None:
    torch.manual_seed(1)
    hidden = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(30, 8, dtype=torch.float64)
    labels = torch.randint(0, 30, (6,))
    logp, ent = linear_logprobs(hidden, weight, labels, with_entropy=True, entropy_grad=False, chunk_size=4)
    (g,) = torch.autograd.grad(logp.sum(), hidden)
    ref = torch.log_softmax(hidden @ weight.T, -1).gather(-1, labels[:, None]).sum()
    (rg,) = torch.autograd.grad(ref, hidden)
    torch.testing.assert_close(g, rg)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 (DTensor) gradient, or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def both_paths(prepare=lambda model: model, entropy_grad: bool = False) -> list[tuple]:
    """(model, log-probs, entropy, every parameter's gradient) of the logits path, then of the fused
    path, each on a fresh copy of one small LM (`prepare` may shard it)."""
    base = small_lm()
    ids, mask = prompts(batch=3, length=12)
    responses = ids[:, -5:]
    results = []
    for fused in (False, True):
        model = prepare(copy.deepcopy(base))
        logp, ent = response_logprobs(model, ids, mask, responses, 0.9, chunk_size=4, with_entropy=True,
                                      entropy_grad=entropy_grad, fused=fused)
        loss = (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum()
        if entropy_grad:
            loss = loss + 0.3 * ent.sum()
        loss.backward()
        grads = {k: full(p.grad).clone() for k, p in model.named_parameters()}
        results.append((model, logp.detach(), ent.detach(), grads))
    return results


def assert_same_values_and_gradients(results: list[tuple]) -> None:
    (_, lp0, e0, g0), (_, lp1, e1, g1) = results
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e1, e0, rtol=1e-5, atol=1e-5)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-4 * float(g0[k].abs().max()), msg=k)
    assert not math.isnan(float(lp1.sum()))


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_fused_response_logprobs_match_unfused_with_gradients(entropy_grad: bool) -> None:
    """The model-level fused path (the trunk, then the head doing chunked log-softmax) equals the
    logits path in values and in every parameter's gradient, tied embeddings included."""
    assert_same_values_and_gradients(both_paths(entropy_grad=entropy_grad))


# --------------------------------------------------------------------------- training fast paths (FSDP2, gloo)


def test_local_shard_clip_and_fused_adamw_equal_torch_on_fsdp2(one_rank_group) -> None:
    """The trainer's clip and AdamW step run on the local shards (no DTensor dispatch): the clip gives
    the global L2 norm and scaling, and the AdamW step is bit-for-bit torch's fused AdamW on the FSDP2
    DTensors, optimizer state layout included (checkpoints stay interchangeable)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from kuberl.training.kernels.optim import clip_grad_norm_local, fused_adamw_step_local

    mesh = init_device_mesh("cpu", (1,))
    a = small_lm()
    b = copy.deepcopy(a)
    fully_shard(a, mesh=mesh)
    fully_shard(b, mesh=mesh)
    kw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    opt_a, opt_b = torch.optim.AdamW(a.parameters(), **kw), torch.optim.AdamW(b.parameters(), **kw)
    ids, mask = prompts(batch=2, length=10)
    for _ in range(3):
        for m in (a, b):
            m(input_ids=ids, attention_mask=mask).logits.float().pow(2).mean().backward()
        # the local clip: same norm (to float rounding: a different summation order) and same scaling
        grads_b = [p.grad.full_tensor().clone() for p in b.parameters()]
        got = clip_grad_norm_local(b.parameters(), 0.5)
        want = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads_b]))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        for p, g in zip(b.parameters(), grads_b):
            scaled = g * min(1.0, 0.5 / (float(got) + 1e-6))
            torch.testing.assert_close(p.grad.full_tensor(), scaled, rtol=1e-6, atol=1e-9)
        # the local fused AdamW step on identical gradients: bit-for-bit torch's fused AdamW
        for pa, pb in zip(a.parameters(), b.parameters()):
            pa.grad = pb.grad.detach().clone()
        opt_a.step()
        fused_adamw_step_local(opt_b)
        opt_a.zero_grad()
        opt_b.zero_grad()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa.full_tensor(), pb.full_tensor()), name
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert torch.equal(sa["step"], sb["step"])
        assert torch.equal(sa["exp_avg_sq"].full_tensor(), sb["exp_avg_sq"].full_tensor())


def test_fused_head_is_an_fsdp2_forward_method_and_matches_the_logits_path(one_rank_group) -> None:
    """Under FSDP2 the fused head runs as a method registered with register_fsdp_forward_method (the
    model's own forward is untouched): same log-probs and parameter gradients as the logits path."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from kuberl.training.kernels.lm_head import FUSED_METHOD

    mesh = init_device_mesh("cpu", (1,))

    def shard(model):
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    results = both_paths(shard, entropy_grad=True)
    assert_same_values_and_gradients(results)
    for (model, *_), fused in zip(results, (False, True)):
        assert "forward" not in model.__dict__ and hasattr(model, FUSED_METHOD) == fused
