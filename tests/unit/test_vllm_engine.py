"""The `vllm` rollout engine.

vLLM is not installed here (its wheels pin another torch), so every test that drives the engine
skips; only the missing-vLLM error is checked everywhere. Where vLLM and a GPU exist, the engine is
exercised on the built-in tiny model: shapes and padding, EOS handling, fixed length, per-sample
seeds, and weight sync through `collective_rpc`.
"""

from __future__ import annotations

import sys

import pytest
import torch

from kuberl.models import char_tokenizer, load_causal_lm
from kuberl.spec import JobSpec

REASON = "vLLM is not installed here (its wheels pin another torch); the engine is written against its public API"


def spec(**rollout) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"builtin": "tiny", "dtype": "bfloat16"},
        "data": {"task": "repeat-letter", "maxPromptLength": 16},
        "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
        "rollout": {"engine": "vllm", "maxNewTokens": 12, "gpuMemoryUtilization": 0.2, **rollout},
        "roles": {"actor": {"gpus": 1}},
    })


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kuberl.rollout import make_engine
    from kuberl.rollout.vllm import VLLMRollout

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    for build in (lambda: VLLMRollout(spec(), char_tokenizer()),
                  lambda: make_engine(spec(), torch.device("cpu"), torch.float32, char_tokenizer())):
        with pytest.raises(RuntimeError) as info:
            build()
        msg = str(info.value)
        assert msg.startswith("spec.rollout.engine: vllm is not installed"), msg
        assert "(fix: use engine hf or the CUDA runtime image" in msg


# -- with vLLM (skipped here) -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("vllm", reason=REASON)
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")
    from kuberl.rollout.vllm import VLLMRollout

    return VLLMRollout(spec(), char_tokenizer())


def prompts(texts: list[str]):
    enc = char_tokenizer()(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def test_generate_shape_dtype_and_right_padding(engine) -> None:
    tok = char_tokenizer()
    ids, mask = prompts(["say a:", "b", "say ccc:"])
    out = engine.generate(ids, mask, seed=0)
    assert out.shape == (3, 12) and out.dtype == torch.long
    assert bool((out >= 0).all()) and bool((out < len(tok)).all())
    for row in out.tolist():
        if tok.eos_token_id in row:
            end = row.index(tok.eos_token_id)
            assert row[end + 1 :] == [tok.pad_token_id] * (len(row) - end - 1)


def test_same_seed_same_responses_and_repeated_prompts_differ(engine) -> None:
    ids, mask = prompts(["say a:"] * 8)
    a = engine.generate(ids, mask, seed=7)
    assert torch.equal(a, engine.generate(ids, mask, seed=7))
    assert not torch.equal(a, engine.generate(ids, mask, seed=8))
    assert len({tuple(r) for r in a.tolist()}) > 1  # a GRPO group must not get one response 8 times


def test_fixed_length_ignores_eos(engine) -> None:
    params = engine._sampling_params(0)
    assert not params.ignore_eos and params.max_tokens == 12
    default_spec = engine.spec
    engine.spec = spec(fixedLength=True)
    try:
        params = engine._sampling_params(0)
        assert params.ignore_eos and not params.stop_token_ids
        ids, mask = prompts(["say a:", "b"])
        assert engine.generate(ids, mask, seed=0).shape == (2, 12)
    finally:
        engine.spec = default_spec


def test_load_weights_changes_and_restores_generation(engine) -> None:
    s = engine.spec
    original = load_causal_lm(s.model, dtype=torch.bfloat16, seed=s.trainer.seed).state_dict()
    ids, mask = prompts(["say a:", "say b:", "c"])
    before = engine.generate(ids, mask, seed=3)
    gen = torch.Generator().manual_seed(0)
    engine.load_weights({k: v + torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in original.items()})
    assert not torch.equal(before, engine.generate(ids, mask, seed=3))
    engine.load_weights(original)  # back to the start: the prefix cache must not serve stale KV
    assert torch.equal(before, engine.generate(ids, mask, seed=3))
