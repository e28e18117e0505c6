"""The `vllm` rollout engine and its weight sync.

vLLM is not installed here (its wheels pin another torch), so every test that drives the engine skips
(reason given); they run on the lent GPU machine, where vLLM 0.26.0 is carried (docs/performance.md). What
runs everywhere: the missing-vLLM error, and the actor's side of the weight sync (bucket plan, staging
buffer, dedup of tied weights, the completeness check) against the real worker extension, called
in-process the way vLLM's in-process executor calls it, with a stand-in model whose `load_weights` copies
by name (vLLM's own name mapping is exercised on the device).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from kuberl.rollout.vllm_worker import KuberlWorkerExtension
from kuberl.rollout.weight_sync import ALIGN, StagedSender, plan_buckets, staging_elems
from kuberl.spec import JobSpec
from kuberl.training.models import char_tokenizer, load_causal_lm

REASON = "vLLM is not installed here (its wheels pin another torch); these tests run on the GPU machine"
ROOT = Path(__file__).resolve().parents[2]


def spec(**rollout) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"builtin": "tiny", "dtype": "bfloat16"},
        "data": {"task": "repeat-letter", "maxPromptLength": 64},
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


# -- the actor's side of the weight sync, on CPU --------------------------------------------------------


def test_bucket_plan_keeps_order_aligns_offsets_and_isolates_large_weights() -> None:
    shapes = [("a", (10, 10)), ("b", (3,)), ("big", (50, 10)), ("c", (7, 2))]
    buckets = plan_buckets(shapes, bucket_elems=256)
    assert [[e[0] for e in b] for b in buckets] == [["a", "b"], ["big"], ["c"]]
    assert [e[1] for e in buckets[0]] == [0, 128] and all(e[1] % ALIGN == 0 for b in buckets for e in b)
    assert staging_elems(buckets) == 512  # the 500-element weight, rounded up to the alignment


class _Model:
    """Stands in for vLLM's model: `named_parameters()` and `load_weights(iterable of (HF name, tensor)) ->
    names written`, here by plain name (vLLM's loader also fuses q/k/v and gate/up)."""

    def __init__(self):
        self.inner = load_causal_lm(spec().model, dtype=torch.bfloat16, seed=99)
        self.named_parameters = self.inner.named_parameters

    def load_weights(self, weights):
        params = dict(self.inner.named_parameters())
        done = set()
        for name, tensor in weights:
            if name.startswith("lm_head.") and self.inner.config.tie_word_embeddings:
                continue  # vLLM skips the tied head too
            params[name].data.copy_(tensor)
            done.add(name)
        return done


class _Worker(KuberlWorkerExtension):
    def __init__(self, model: _Model):
        self.model, self.device = model, torch.device("cpu")

    def get_model(self):
        return self.model


def _rpc(worker: _Worker, calls: list[str]):
    def rpc(method: str, args: tuple = ()) -> list:
        calls.append(method)
        return [getattr(worker, method)(*args)]
    return rpc


def test_staged_sender_writes_every_weight_through_small_buckets_and_reuses_its_buffer() -> None:
    actor = load_causal_lm(spec().model, dtype=torch.float32, seed=0)
    worker = _Worker(_Model())
    expected = set(worker.kuberl_param_names())
    calls: list[str] = []
    sender = StagedSender(_rpc(worker, calls), torch.device("cpu"), torch.bfloat16, True, expected, bucket_bytes=4096)
    state = actor.state_dict()
    stats = sender.send(state)
    got = dict(worker.model.inner.named_parameters())
    for name, value in state.items():
        if name in got:
            assert torch.equal(got[name].detach(), value.to(torch.bfloat16)), name
    assert stats["buckets"] > 3 and calls.count("kuberl_open_staging") == 1
    assert stats["bytes"] == sum(p.numel() for p in actor.parameters()) * 2  # tied head sent once
    for p in actor.parameters():
        p.data.add_(1.0)
    sender.send(actor.state_dict())
    assert calls.count("kuberl_open_staging") == 1
    assert torch.equal(got["model.norm.weight"].detach(), actor.model.norm.weight.to(torch.bfloat16))


def test_staged_sender_refuses_a_partial_state_dict() -> None:
    actor = load_causal_lm(spec().model, dtype=torch.float32, seed=0)
    worker = _Worker(_Model())
    sender = StagedSender(_rpc(worker, []), torch.device("cpu"), torch.bfloat16, True,
                          set(worker.kuberl_param_names()), bucket_bytes=1 << 20)
    partial = {k: v for k, v in actor.state_dict().items() if "layers.0.mlp" not in k}
    with pytest.raises(RuntimeError, match=r"engine parameters were not written, e.g. \['model.layers.0.mlp"):
        sender.send(partial)


class _StandInLLM:
    """Stands in for `vllm.LLM` so the engine's own logic (sync, sleep state, outputs) runs on CPU; its
    `collective_rpc` calls the real worker extension in-process, as vLLM's in-process executor does."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self.worker = _Worker(_Model())

    def collective_rpc(self, method, args=()):
        self.calls.append(method)
        if method == "kuberl_worker_info":
            return [{"pid": os.getpid(), "device_uuid": "cpu"}]
        return [getattr(self.worker, method)(*args)]

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append("generate")
        out = []
        for _prompt, p in zip(prompts, params):
            tokens = [3 + p.seed % 7] * p.max_tokens
            # vLLM's FlatLogprobs (flat_logprobs=True, logprobs=0): per position its drawn token, then none else
            logprobs = None if p.logprobs is None else types.SimpleNamespace(
                start_indices=list(range(len(tokens))), token_ids=tokens,
                logprobs=[-0.25 * (1 + i % 3) for i in range(len(tokens))])
            completion = type("Completion", (), {"token_ids": tokens, "logprobs": logprobs})()
            out.append(type("Request", (), {"outputs": [completion], "num_cached_tokens": 0})())
        return out

    def sleep(self, level):
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags):
        self.calls.append(f"wake {','.join(tags)}")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True


class _StandInParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def test_engine_logic_with_a_stand_in_for_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without vLLM: the engine's sleep/sync state machine, its outputs and the built-in model directory
    (made once, reused). The real engine is exercised by the device tests below."""
    import tempfile

    from kuberl.rollout.vllm import VLLMRollout

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_StandInLLM, SamplingParams=_StandInParams))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    eng = VLLMRollout(spec(), char_tokenizer(), torch.device("cpu"))
    assert eng.in_process and eng.llm.kwargs["enable_sleep_mode"] and eng.llm.kwargs["skip_tokenizer_init"]
    model_dir = Path(eng.llm.kwargs["model"])
    assert (model_dir / ".complete").exists() and (model_dir / "config.json").exists()
    assert VLLMRollout(spec(), char_tokenizer(), torch.device("cpu")).llm.kwargs["model"] == str(model_dir)
    weights = load_causal_lm(spec().model, dtype=torch.float32, seed=0).state_dict()
    eng.load_weights(weights)
    assert eng.llm.calls[-1] == "reset_prefix_cache" and eng.last_sync["woke"] == 0.0
    ids, mask = prompts(["say a:", "b"])
    out = eng.generate(ids, mask, seed=1)
    assert out.shape == (2, 12) and eng.llm.calls[-1] == "sleep 2"
    assert eng.rollout_logprobs()[0].tolist() == [-0.25, -0.5, -0.75] * 4  # each drawn token's, vLLM's own
    with pytest.raises(RuntimeError, match="load_weights must run before the next generate"):
        eng.generate(ids, mask, seed=1)
    eng.load_weights(weights)
    sync = [c for c in eng.llm.calls[eng.llm.calls.index("sleep 2"):] if not c.startswith("kuberl_load")]
    assert sync == ["sleep 2", "wake weights", "wake kv_cache", "reset_prefix_cache"] and eng.last_sync["woke"] == 1.0
    assert torch.equal(eng.generate(ids, mask, seed=1), out)


def test_greedy_answers_with_a_stand_in_for_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Evaluation through the interface: temperature 0, a stop at EOS even under fixedLength, and the engine left
    awake for the next rollout (no sync comes between them); rollouts still ignore EOS and sleep after."""
    import tempfile

    from kuberl.rollout.vllm import VLLMRollout

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_StandInLLM, SamplingParams=_StandInParams))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    eng = VLLMRollout(spec(fixedLength=True), char_tokenizer(), torch.device("cpu"))
    seen: list[_StandInParams] = []
    generate = eng.llm.generate
    monkeypatch.setattr(eng.llm, "generate", lambda prompts, params, use_tqdm=False: (
        seen.extend(params), generate(prompts, params, use_tqdm))[1])
    eng.load_weights(load_causal_lm(spec().model, dtype=torch.float32, seed=0).state_dict())
    ids, mask = prompts(["say a:", "b"])
    assert eng.greedy_answers(ids, mask).shape == (2, 12) and not eng._asleep
    assert all(p.temperature == 0.0 and not p.ignore_eos and p.stop_token_ids == [char_tokenizer().eos_token_id]
               for p in seen)
    seen.clear()
    eng.generate(ids, mask, seed=1)
    assert eng._asleep and all(p.ignore_eos and not p.stop_token_ids for p in seen)
    with pytest.raises(RuntimeError, match="asynchronous needs engine hf"):
        eng.behaviour_model()
    assert eng.resident_modules() == []


# -- with vLLM and a GPU (skipped here) -----------------------------------------------------------------


def _need_vllm() -> None:
    pytest.importorskip("vllm", reason=REASON)
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA device")


@pytest.fixture(scope="module")
def engine():
    _need_vllm()
    from kuberl.rollout.vllm import VLLMRollout

    eng = VLLMRollout(spec(), char_tokenizer(), enforce_eager=True)  # vLLM's default mode: engine in its own process
    eng.sleep_after_generate = False  # tests that sleep say so
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return load_causal_lm(spec().model, dtype=torch.bfloat16, seed=0).state_dict()


def prompts(texts: list[str]):
    enc = char_tokenizer()(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


LONG = ["say a: " + "abcdefgh" * 6, "say b: " + "12345678" * 6]  # several 16-token KV blocks: prefix-cacheable


def test_engine_runs_in_its_own_process(engine) -> None:
    assert not engine.in_process, "vLLM's default multiprocessing mode: the weight sync must cross processes"


def test_generate_shape_dtype_and_right_padding(engine, weights) -> None:
    engine.load_weights(weights)
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


def test_weight_sync_changes_and_restores_generation(engine, weights) -> None:
    ids, mask = prompts(LONG + ["c"])
    engine.load_weights(weights)
    before = engine.generate(ids, mask, seed=3)
    gen = torch.Generator().manual_seed(0)
    engine.load_weights({k: v + torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in weights.items()})
    assert engine.last_sync["seconds"] > 0 and engine.last_sync["bytes"] > 0
    assert not torch.equal(before, engine.generate(ids, mask, seed=3))
    engine.load_weights(weights)  # back to the start: the prefix cache must not serve KV of the perturbed weights
    assert torch.equal(before, engine.generate(ids, mask, seed=3))


def test_prefix_cache_is_used_between_syncs_and_emptied_by_a_sync(engine, weights) -> None:
    ids, mask = prompts(LONG)
    engine.load_weights(weights)
    first = engine.generate(ids, mask, seed=5)
    assert engine.last_cached_tokens == 0
    engine.generate(ids, mask, seed=5)
    assert engine.last_cached_tokens > 0
    engine.load_weights(weights)
    assert torch.equal(first, engine.generate(ids, mask, seed=5))
    assert engine.last_cached_tokens == 0, "KV blocks from before the sync were reused"


def test_a_multi_turn_rollouts_next_turn_continues_from_the_prefix_cache(engine, weights) -> None:
    """A second turn's prompt is the first's prompt and response: under sleep mode, inside `turns()`, its KV comes
    from the prefix cache (the engine did not sleep, which would drop the cache, between the turns)."""
    engine.load_weights(weights)
    engine.sleep_after_generate = True
    try:
        with engine.turns():
            ids, mask = prompts(LONG)
            first = engine.generate(ids, mask, seed=2)
            following = torch.cat([ids, first], 1), torch.cat([mask, (first != char_tokenizer().pad_token_id)
                                                                .long()], 1)
            engine.generate(*following, seed=3)
            assert engine.last_cached_tokens >= 2 * 32, engine.last_cached_tokens  # blocks of both prompts
        assert engine._asleep
    finally:
        engine.sleep_after_generate = False
    engine.load_weights(weights)


def test_sleep_returns_memory_and_the_next_sync_brings_the_engine_back(engine, weights) -> None:
    ids, mask = prompts(LONG)
    engine.load_weights(weights)
    want = engine.generate(ids, mask, seed=9)
    awake_free = torch.cuda.mem_get_info()[0]
    engine.sleep_after_generate = True
    try:
        engine.generate(ids, mask, seed=9)
        asleep_free = torch.cuda.mem_get_info()[0]
        total = torch.cuda.mem_get_info()[1]
        assert asleep_free - awake_free > 0.1 * total, (awake_free, asleep_free)  # the KV cache (0.2 of the GPU)
        with pytest.raises(RuntimeError, match="load_weights must run before the next generate"):
            engine.generate(ids, mask, seed=9)
        engine.load_weights(weights)  # level 2 discarded the weights: the sync writes all of them
        assert engine.last_sync["woke"] == 1.0
        assert torch.equal(want, engine.generate(ids, mask, seed=9))
    finally:
        engine.sleep_after_generate = False
        if engine._asleep:
            engine.load_weights(weights)


def test_greedy_answers_stop_at_eos_and_leave_the_engine_awake(engine, weights) -> None:
    """Evaluation (kuberl.controller.evaluation) on vLLM: deterministic, right-padded after EOS, and the next rollout
    runs without a sync in between even when the engine sleeps after rollouts."""
    tok = char_tokenizer()
    engine.load_weights(weights)
    ids, mask = prompts(LONG + ["c"])
    engine.sleep_after_generate = True
    try:
        first = engine.greedy_answers(ids, mask)
        assert not engine._asleep and torch.equal(first, engine.greedy_answers(ids, mask))
        for row in first.tolist():
            if tok.eos_token_id in row:
                end = row.index(tok.eos_token_id)
                assert row[end + 1 :] == [tok.pad_token_id] * (len(row) - end - 1)
        assert torch.equal(engine.generate(ids, mask, seed=0, greedy=True), first)  # same greedy path, no EOS rule
        assert engine._asleep
    finally:
        engine.sleep_after_generate = False
        if engine._asleep:
            engine.load_weights(weights)


def test_weight_sync_in_process_mode() -> None:
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 (engine in this process): the buffer is passed, not IPC-mapped."""
    _need_vllm()
    code = textwrap.dedent("""
        import torch
        from kuberl.training.models import char_tokenizer, load_causal_lm
        from kuberl.rollout.vllm import VLLMRollout
        from tests.unit.test_vllm_engine import LONG, prompts, spec
        eng = VLLMRollout(spec(), char_tokenizer(), enforce_eager=True, sleep=False)
        assert eng.in_process
        w = load_causal_lm(spec().model, dtype=torch.bfloat16, seed=0).state_dict()
        ids, mask = prompts(LONG)
        eng.load_weights(w)
        before = eng.generate(ids, mask, seed=1)
        eng.load_weights({k: v * 1.5 for k, v in w.items()})
        assert not torch.equal(before, eng.generate(ids, mask, seed=1))
        eng.load_weights(w)
        assert torch.equal(before, eng.generate(ids, mask, seed=1))
        print("IN-PROCESS OK", eng.last_sync)
    """)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0 and "IN-PROCESS OK" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_turns_of_a_multi_turn_rollout_keep_a_sleeping_engine_awake(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """Under sleep mode the engine sleeps after a generate; inside `turns()` it sleeps once, after the last turn, so
    every turn after the first can continue from vLLM's prefix cache (no sync, no reset between them)."""
    import tempfile

    from kuberl.rollout.vllm import VLLMRollout

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_StandInLLM, SamplingParams=_StandInParams))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    eng = VLLMRollout(spec(), char_tokenizer(), torch.device("cpu"))
    eng.load_weights(load_causal_lm(spec().model, dtype=torch.float32, seed=0).state_dict())
    ids, mask = prompts(["say a:", "b"])
    start = len(eng.llm.calls)
    with eng.turns():
        for turn in range(3):
            eng.generate(ids, mask, seed=turn)
            assert not eng._asleep
    assert eng.llm.calls[start:] == ["generate"] * 3 + ["sleep 2"] and eng._asleep and eng.sleep_after_generate
