"""The fast `hf` rollout path on a CUDA device: CUDA-graph decoding against eager transformers generate,
the flash decode attention against SDPA, and the compiled sampler against the eager one.

Greedy decoding must give the same tokens as `model.generate(do_sample=False)`. Two implementations
of the same bf16 model (different kernels, different summation orders) can legitimately disagree
where the top two logits are within rounding of each other; so each comparison finds, per
sequence, the first position where the two disagree (if any) and checks with the reference model
that the two tokens there are a near tie. The share of identical sequences and tokens is printed.
Run: `pytest -m gpu tests/gpu -s` on a machine with a GPU (skipped elsewhere).
"""

from __future__ import annotations

import pytest
import torch

from kuberl.rollout.fast import SamplingParams, StaticDecoder
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.sampling import sample, sample_scalars
from kuberl.spec import JobSpec
from kuberl.spec.model import ModelSource
from kuberl.training.models import char_tokenizer, load_causal_lm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOK = char_tokenizer()
PAD, EOS = TOK.pad_token_id, TOK.eos_token_id


@pytest.fixture(scope="module")
def qwen05() -> torch.nn.Module:
    model = load_causal_lm(ModelSource(builtin="qwen2-0.5b"), dtype=torch.bfloat16, device="cuda").cuda().eval()
    return model.requires_grad_(False)


def left_padded(batch: int, length: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch):
        n = (i * 5) % (length // 2)
        ids[i, :n], mask[i, :n] = PAD, 0
    return ids.cuda(), mask.cuda()


def hf_greedy(model, ids, mask, new_tokens: int) -> torch.Tensor:
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    return out


def compare(model, ids, mask, ours: torch.Tensor, ref: torch.Tensor, tie_tol: float, label: str) -> dict:
    """Identical sequences / tokens, and the logit gap (reference model) at every first disagreement."""
    same_rows = (ours == ref).all(-1)
    gaps = []
    for i in torch.nonzero(~same_rows).flatten().tolist():
        d = int(torch.nonzero(ours[i] != ref[i])[0])
        seq = torch.cat([ids[i], ref[i, :d]])[None]
        m = torch.cat([mask[i], torch.ones(d, dtype=mask.dtype, device=mask.device)])[None]
        with torch.no_grad():
            logits = model(input_ids=seq, attention_mask=m).logits[0, -1].float()
        gaps.append(abs(float(logits[ref[i, d]] - logits[ours[i, d]])))
    stats = {"rows_identical": float(same_rows.float().mean()), "tokens_identical": float((ours == ref).float().mean()),
             "max_gap_at_divergence": max(gaps, default=0.0), "divergent_rows": len(gaps)}
    print(f"\n{label}: {stats}")
    assert all(g <= tie_tol for g in gaps), f"{label}: a disagreement that is not a near tie: {stats}, gaps {gaps}"
    return stats


def test_graph_greedy_matches_eager_generate_bf16(qwen05) -> None:
    ids, mask = left_padded(16, 48, qwen05.config.vocab_size)
    ours = StaticDecoder(qwen05, PAD, EOS).generate(ids, mask, 64, SamplingParams(greedy=True, suppress_eos=True))
    ref = hf_greedy(qwen05, ids, mask, 64)
    compare(qwen05, ids, mask, ours, ref, tie_tol=0.125, label="bf16 graphs vs transformers generate")


def test_graph_greedy_matches_eager_generate_fp32() -> None:
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = load_causal_lm(ModelSource(builtin="qwen2-0.5b"), dtype=torch.float32, device="cuda").cuda().eval()
        model.requires_grad_(False)
        ids, mask = left_padded(8, 32, model.config.vocab_size, seed=1)
        ours = StaticDecoder(model, PAD, EOS).generate(ids, mask, 48, SamplingParams(greedy=True, suppress_eos=True))
        ref = hf_greedy(model, ids, mask, 48)
        stats = compare(model, ids, mask, ours, ref, tie_tol=1e-3, label="fp32 graphs vs transformers generate")
        assert stats["rows_identical"] >= 0.75
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def test_inductor_graphs_agree_with_plain_graphs(qwen05) -> None:
    ids, mask = left_padded(16, 48, qwen05.config.vocab_size, seed=2)
    sp = SamplingParams(greedy=True, suppress_eos=True)
    plain = StaticDecoder(qwen05, PAD, EOS).generate(ids, mask, 48, sp)
    fused = StaticDecoder(qwen05, PAD, EOS, compile=True).generate(ids, mask, 48, sp)
    compare(qwen05, ids, mask, fused, plain, tie_tol=0.125, label="bf16 graphs+inductor vs graphs")


def test_weight_sync_in_place_keeps_graphs_valid() -> None:
    """After load_weights, replaying the graph captured with the old weights gives what an eager run
    of the same step gives with the new weights (the graph reads the parameters in place)."""
    spec = JobSpec.model_validate({"model": {"builtin": "qwen2-0.5b", "dtype": "bfloat16"},
                                   "data": {"task": "repeat-letter"},
                                   "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
                                   "rollout": {"maxNewTokens": 32, "compile": True, "fixedLength": True}})
    engine = HFRollout(spec, torch.device("cuda"), torch.bfloat16, TOK, inductor=False)
    assert engine.path == "static-graphs"
    ids, mask = left_padded(8, 32, engine.model.config.vocab_size, seed=3)
    sp = SamplingParams(greedy=True, suppress_eos=True)
    before = engine.fast.generate(ids, mask, 32, sp)
    graph = engine.fast._state.graph
    torch.manual_seed(11)
    new = {k: v.float() + 0.02 * torch.randn_like(v.float()) for k, v in engine.model.state_dict().items()}
    engine.load_weights(new)
    after = engine.fast.generate(ids, mask, 32, sp)
    assert engine.fast._state.graph is graph, "same shape: the graph must be reused, not recaptured"
    eager = StaticDecoder(engine.model, PAD, EOS, use_graphs=False).generate(ids, mask, 32, sp)
    stats = compare(engine.model, ids, mask, after, eager, tie_tol=0.125, label="graph after weight sync vs eager step")
    assert stats["rows_identical"] >= 0.75
    assert not torch.equal(before, after)


def test_sampling_on_gpu_eos_and_fixed_length() -> None:
    """A small model with large weights (so EOS does come up): after EOS only pad; fixed length never EOS;
    same seed, same tokens; top_p < 1 runs inside the graph."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.4, pad_token_id=PAD, eos_token_id=EOS)
    model = Qwen2ForCausalLM(cfg).cuda().eval()
    dec = StaticDecoder(model, PAD, EOS)
    ids, mask = left_padded(64, 16, 50, seed=4)
    greedy = dec.generate(ids, mask, 40, SamplingParams(greedy=True))
    ref = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=PAD,
                         eos_token_id=EOS)[:, ids.shape[1]:]
    ref = torch.nn.functional.pad(ref, (0, 40 - ref.shape[1]), value=PAD)
    compare(model, ids, mask, greedy, ref, tie_tol=1e-3, label="small fp32 model with EOS")
    for sp in (SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9)):
        torch.manual_seed(1)
        a = dec.generate(ids, mask, 40, sp)
        torch.manual_seed(1)
        b = dec.generate(ids, mask, 40, sp)
        assert torch.equal(a, b)
        ended = 0
        for row in a.tolist():
            if EOS in row:
                ended += 1
                assert all(t == PAD for t in row[row.index(EOS) + 1:])
        assert ended > 0
    fixed = dec.generate(ids, mask, 40, SamplingParams(suppress_eos=True))
    assert not bool((fixed == EOS).any())


def test_flash_decode_is_chosen_in_bf16_and_agrees_with_sdpa(qwen05) -> None:
    ids, mask = left_padded(16, 48, qwen05.config.vocab_size, seed=5)
    sp = SamplingParams(greedy=True, suppress_eos=True)
    flash = StaticDecoder(qwen05, PAD, EOS)
    assert flash.attention == "flash", flash.attention_note
    sdpa = StaticDecoder(qwen05, PAD, EOS, attention="sdpa")
    compare(qwen05, ids, mask, flash.generate(ids, mask, 48, sp), sdpa.generate(ids, mask, 48, sp), tie_tol=0.125,
            label="bf16 flash vs sdpa decode attention")


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_compiled_sampler_agrees_with_eager_and_stays_in_the_nucleus(top_p: float) -> None:
    """Same noise key, same tokens (inductor's exp/log may differ from eager in the last bit: near-ties
    can flip, so >= 99.5% identical), and every compiled draw inside the nucleus computed by sorting."""
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(256, 151936, device="cuda", generator=g) * 0.6).to(torch.bfloat16)
    seed, step = torch.tensor([5], device="cuda"), torch.tensor([3], device="cuda")
    sp = SamplingParams(top_p=top_p)
    eager, _ = sample(logits, sp, None, seed, step)
    compiled_fn = torch.compile(sample_scalars, dynamic=False, fullgraph=True)
    compiled, unresolved = compiled_fn(logits, False, 1.0, top_p, False, None, seed, step)
    agree = float((eager == compiled).float().mean())
    print(f"\ncompiled vs eager sampler, top_p {top_p}: {agree:.4f} identical")
    assert agree >= 0.995
    if top_p < 1.0:
        probs = torch.softmax(logits.float(), -1)
        sorted_p, order = probs.sort(-1, descending=True)
        ranks = torch.arange(order.shape[-1], device="cuda").expand_as(order)
        rank = torch.empty_like(order).scatter_(-1, order, ranks)
        inside = (sorted_p.cumsum(-1) - sorted_p < top_p).sum(-1)
        assert bool((rank.gather(-1, compiled[:, None]).squeeze(-1) < inside).all())
        assert int(unresolved.sum()) == 0


def test_top_p_in_the_graph_resolves_its_draws(qwen05) -> None:
    """The compiled nucleus inside the captured graph (the shape of the inductor test above: only the head
    recompiles); 16 x 48 draws, each unresolved with probability 1e-7."""
    dec = StaticDecoder(qwen05, PAD, EOS, compile=True)
    ids, mask = left_padded(16, 48, qwen05.config.vocab_size, seed=6)
    torch.manual_seed(0)
    out = dec.generate(ids, mask, 48, SamplingParams(top_p=0.9, suppress_eos=True))
    assert out.shape == (16, 48) and dec.unresolved_draws == 0, dec.unresolved_draws
