"""Rollout throughput at one model shape: our `hf` fast path, transformers' own paths, and vLLM (plain and
through our engine), in one process per call; plus, for vLLM, weight-sync time, the weight and prefix-cache
checks and sleep-mode memory; and a profile of one fast-path decode step.

    python3 bench/rollout.py --engine hf --model qwen2-0.5b --batch 256,1024 --top-p 1.0,0.9 --variants fast,graphs
    python3 bench/rollout.py --engine hf --model qwen2-0.5b --variants fast --profile
    python3 bench/rollout.py --engine hf --model qwen2-0.5b --variants generate,generate-static,cb
    python3 bench/rollout.py --engine vllm --model qwen2-0.5b --batch 256,1024 --top-p 1.0,0.9 --sync --checks --sleep
    python3 bench/rollout.py --quick        # CPU smoke test (tiny model), what tests/unit/test_rollout_bench.py runs

Variants (every one emits exactly --new-tokens tokens per sequence: EOS suppressed or ignored; tokens/s
counts the tokens the engine returned, over the wall time of the call, prefill included):
  hf    fast             StaticDecoder as the runtime runs it (rollout.compile): graphs + torch.compile
        graphs           StaticDecoder, CUDA graphs without torch.compile
        generate         transformers `generate`, DynamicCache, eager
        generate-static  transformers `generate`, cache_implementation="static" and its default CompileConfig
                         (torch.compile of the forward, mode "reduce-overhead": CUDA graphs)
        cb               transformers continuous batching (`generate_batch`), CUDA graphs forced on
  vllm  vllm-plain       vLLM `LLM.generate` on token prompts, one SamplingParams for all (no seeds)
        vllm-seeded      the same with one seed per request
        vllm-logprobs    seeded, and the drawn token's log-prob returned flat (what our engine sends)
        vllm-engine      our engine, `VLLMRollout.generate` (prompt/response tensors, per-sample seeds)
The vLLM variants share one engine (one start-up per process: ~45 s with torch.compile and CUDA graphs);
the prefix cache is reset before every timed call, so every call runs its prefill. Timed calls of the
variants are interleaved. The model is a random-init built-in shape in bf16 (fp32 on CPU); prompts are
random token ids, exactly --prompt-len long.

Output: one JSON line per measurement on stdout, appended to --jsonl as soon as it is done, then a table.
`--deadline-s` stops starting new measurements past that many seconds (the comparison script's budget).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from devmem import used_gib  # noqa: E402

from kuberl.rollout.fast import SamplingParams, StaticDecoder  # noqa: E402
from kuberl.spec.model import ModelSource  # noqa: E402
from kuberl.training.models import builtin_config, char_tokenizer, load_causal_lm  # noqa: E402

HF_VARIANTS = ("fast", "graphs", "generate", "generate-static", "cb")
VLLM_VARIANTS = ("vllm-plain", "vllm-seeded", "vllm-logprobs", "vllm-engine")


class Bench:
    """Shared state of one run: arguments, info fields, the results file, the deadline."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.device = torch.device(args.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.tok = char_tokenizer()
        self.rows: list[dict] = []
        self.vocab = 0  # vocabulary of the model under test (prompt ids are drawn below it)
        self.info = {"engine": args.engine, "model": args.model, "dtype": str(self.dtype).removeprefix("torch."),
                     "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "torch": torch.__version__,
                     "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
                     "machine": platform.node()}
        import transformers

        self.info["transformers"] = transformers.__version__

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        self.sync()
        t = time.perf_counter()
        out = fn()
        self.sync()
        return time.perf_counter() - t, out

    def late(self) -> bool:
        return bool(self.args.deadline_s) and time.perf_counter() - self.t0 > self.args.deadline_s

    def emit(self, row: dict) -> None:
        row = {**self.info, **row}
        self.rows.append(row)
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if self.args.jsonl:
            with open(self.args.jsonl, "a") as f:
                f.write(line + "\n")

    def prompts(self, batch: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, vocab, (batch, self.args.prompt_len), generator=g).to(self.device)
        return ids, torch.ones_like(ids)

    def throughput(self, variant: str, batch: int, top_p: float, times: list[float], tokens: int,
                   first: float | None = None, **extra) -> None:
        med = statistics.median(times)
        self.emit({"kind": "throughput", "variant": variant, "batch": batch, "top_p": top_p,
                   "tokens_per_s": tokens / med, "seconds_median": med, "seconds_all": times, "tokens": tokens,
                   "first_call_s": first, **extra})


# --------------------------------------------------------------------------- hf: ours and transformers'


def hf_model(b: Bench):
    model = load_causal_lm(ModelSource(builtin=b.args.model), dtype=b.dtype, device=b.device).to(b.device).eval()
    return model.requires_grad_(False)


def run_static_decoder(b: Bench, model, variant: str, decoders: dict, batch: int, top_p: float) -> None:
    if variant not in decoders:
        decoders[variant] = StaticDecoder(model, b.tok.pad_token_id, b.tok.eos_token_id, compile=variant == "fast")
    dec = decoders[variant]
    r = b.args.new_tokens
    sp = SamplingParams(temperature=1.0, top_p=top_p, suppress_eos=True)
    ids, mask = b.prompts(batch, b.vocab, 0)
    torch.manual_seed(0)
    first, out = b.timed(lambda: dec.generate(ids, mask, r, sp))
    assert out.shape == (batch, r) and not bool((out == b.tok.eos_token_id).any())
    times = [b.timed(lambda: dec.generate(ids, mask, r, sp))[0] for _ in range(b.args.repeats)]
    b.throughput(variant, batch, top_p, times, batch * r, first, attention=dec.attention,
                 attention_note=dec.attention_note, compiled=dec.compiled, graphs=dec.use_graphs,
                 unresolved_draws=dec.unresolved_draws)
    if b.args.profile and (variant == "fast" or b.device.type != "cuda"):  # CPU: the eager step
        b.emit({"kind": "profile", "variant": variant, "batch": batch, "top_p": top_p, **profile_decode(b, dec)})


def profile_decode(b: Bench, dec: StaticDecoder, max_steps: int = 20) -> dict:
    """Kernels of `steps` decode steps (CUDA graph replays, mid-generation: half the new tokens in the cache),
    by device time per step, with the wall time per step measured by CUDA events outside the profiler."""
    from torch.profiler import ProfilerActivity, profile

    st = dec._state
    steps = min(max_steps, st.new_tokens - 1)
    start = (st.new_tokens - steps) // 2

    def reset() -> None:
        st.slot.fill_(st.prompt_len + start)  # full-length prompts: every row has prompt_len + start slots used
        st.step.fill_(start)

    def run() -> None:
        for _ in range(steps):
            if st.graph is not None:
                st.graph.replay()
            else:
                dec._decode_step(st)

    cuda = b.device.type == "cuda"
    reset()
    run()  # warm
    reset()
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        torch.cuda.synchronize()
        wall_us = e0.elapsed_time(e1) * 1e3 / steps
    else:
        wall_us = b.timed(run)[0] * 1e6 / steps
    reset()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        run()
        b.sync()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", 0) or 0
        us = dev_us if cuda else (e.self_cpu_time_total or 0)
        if us > 0 and (not cuda or dev_us > 0):
            rows.append({"name": e.key[:140], "calls_per_step": e.count / steps, "us_per_step": us / steps})
    rows.sort(key=lambda x: -x["us_per_step"])
    total = sum(x["us_per_step"] for x in rows)
    cats: dict[str, float] = {}
    for x in rows:
        cats[kernel_category(x["name"])] = cats.get(kernel_category(x["name"]), 0.0) + x["us_per_step"]
    return {"steps": steps, "wall_us_per_step": wall_us, "kernel_us_per_step": total,
            "kernels_per_step": sum(x["calls_per_step"] for x in rows), "by_category_us": cats, "top": rows[:25],
            "attention": dec.attention, "compiled": dec.compiled}


def kernel_category(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "sm90", "matmul", "mm_", "addmm", "linear")):
        return "gemm"
    if "triton" in n:
        return "triton (inductor fused)"
    if any(k in n for k in ("index", "copy", "cat", "gather", "scatter", "fill")):
        return "copy/index"
    if any(k in n for k in ("reduce", "argmax", "max", "sum")):
        return "reduction"
    return "elementwise/other"


def run_transformers(b: Bench, model, variant: str, batch: int, top_p: float) -> None:
    r, pad, eos = b.args.new_tokens, b.tok.pad_token_id, b.tok.eos_token_id
    ids, mask = b.prompts(batch, b.vocab, 0)
    sample = dict(do_sample=True, temperature=1.0, top_p=top_p, top_k=0)
    if variant in ("generate", "generate-static"):
        extra: dict = {}
        if variant == "generate-static":
            from transformers import CompileConfig

            extra = dict(cache_implementation="static", compile_config=CompileConfig())

        def call(n: int = r) -> int:
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 pad_token_id=pad, eos_token_id=eos, **sample, **extra)
            assert out.shape == (batch, ids.shape[1] + n), out.shape
            return batch * n

        torch.manual_seed(0)
        first = b.timed(call if variant == "generate-static" else lambda: call(4))[0]  # compile, or a short warm-up
        reps = 1 if (variant == "generate" and b.device.type == "cuda") else b.args.repeats  # ~15 s a call on an H200
        times = [b.timed(call)[0] for _ in range(reps)]
        note = "DynamicCache, eager" if variant == "generate" else "static cache, CompileConfig() (reduce-overhead)"
        b.throughput(variant, batch, top_p, times, batch * r, first if variant == "generate-static" else None,
                     note=note)
        return
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(max_new_tokens=r, eos_token_id=None, pad_token_id=pad, **sample)
    cuda = b.device.type == "cuda"  # CUDA graphs forced on (transformers' auto choice is off with sdpa)
    cb = ContinuousBatchingConfig(use_cuda_graph=cuda, max_requests_per_batch=batch)
    inputs = [row.tolist() for row in ids.cpu()]
    attn = model.config._attn_implementation  # generate_batch switches the model to a paged variant

    def call() -> int:
        res = model.generate_batch(inputs=inputs, generation_config=gen, continuous_batching_config=cb,
                                   persistent_manager=True, progress_bar=False)
        return sum(len(o.generated_tokens) for o in res.values())

    try:
        first, tokens = b.timed(call)  # includes the manager's warm-up (graph capture)
        runs = [b.timed(call) for _ in range(b.args.repeats)]
    finally:
        model.destroy_cached_continuous_batching_manager()
        model.set_attn_implementation(attn)
    assert all(t == batch * r for _, t in runs), [t for _, t in runs]
    b.throughput("cb", batch, top_p, [t for t, _ in runs], batch * r, first,
                 note=f"generate_batch, use_cuda_graph={cb.use_cuda_graph}, attention paged|{attn}")


def run_hf(b: Bench) -> None:
    model = hf_model(b)
    b.vocab = model.config.vocab_size
    decoders: dict = {}
    for batch, top_p, variant in itertools.product(b.args.batches, b.args.top_ps, b.args.variant_list):
        if b.late():
            b.emit({"kind": "skipped", "variant": variant, "batch": batch, "top_p": top_p, "why": "deadline"})
            continue
        try:
            if variant in ("fast", "cb") and b.device.type != "cuda":
                why = {"fast": "the torch.compile variant is for CUDA",
                       "cb": "transformers sizes its paged cache from GPU memory (on CPU it needs psutil)"}[variant]
                b.emit({"kind": "skipped", "variant": variant, "batch": batch, "top_p": top_p, "why": why})
                continue
            if variant in ("fast", "graphs"):
                run_static_decoder(b, model, variant, decoders, batch, top_p)
            else:
                run_transformers(b, model, variant, batch, top_p)
        except Exception as exc:  # one variant failing must not stop the others
            b.emit({"kind": "error", "variant": variant, "batch": batch, "top_p": top_p,
                    "error": f"{type(exc).__name__}: {exc}"[:2000]})
        finally:
            if b.device.type == "cuda":
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------- vllm


def vllm_spec(b: Bench, top_p: float):
    from kuberl.spec import JobSpec

    return JobSpec.model_validate({
        "model": {"builtin": b.args.model, "dtype": "bfloat16"},
        "data": {"task": "repeat-letter", "maxPromptLength": b.args.prompt_len},
        "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
        "rollout": {"engine": "vllm", "maxNewTokens": b.args.new_tokens, "temperature": 1.0, "topP": top_p,
                    "fixedLength": True, "gpuMemoryUtilization": b.args.gpu_memory_utilization},
        "roles": {"actor": {"gpus": 1}},
    })


def actor_like_weights(b: Bench, seed: int = 0) -> dict[str, torch.Tensor]:
    """A full state dict in fp32 on the GPU, as the actor's FSDP full_state_dict hands it over."""
    model = load_causal_lm(ModelSource(builtin=b.args.model), dtype=torch.float32, seed=seed, device=b.device)
    return model.state_dict()


def run_vllm(b: Bench) -> None:
    import vllm

    from kuberl.rollout.vllm import VLLMRollout

    b.info["vllm"] = vllm.__version__
    b.vocab = builtin_config(b.args.model).vocab_size
    engine = VLLMRollout(vllm_spec(b, b.args.top_ps[0]), b.tok, b.device, sleep=True)
    engine.sleep_after_generate = False
    b.emit({"kind": "start", "variant": "vllm-engine", "seconds": engine.start_s, "in_process": engine.in_process,
            "gpu_memory_utilization": b.args.gpu_memory_utilization})
    weights = actor_like_weights(b)
    engine.load_weights(weights)
    b.emit({"kind": "sync", "variant": "first", **engine.last_sync})
    steps = [("sync", b.args.sync, lambda: measure_sync(b, engine, weights)),
             ("checks", b.args.checks, lambda: measure_checks(b, engine, weights))]
    for batch, top_p in itertools.product(b.args.batches, b.args.top_ps):
        steps.append((f"throughput b{batch} p{top_p}", True,
                      lambda batch=batch, top_p=top_p: vllm_throughput(b, engine, batch, top_p)))
    steps += [("sleep", b.args.sleep, lambda: measure_sleep(b, engine, weights))]
    for name, wanted, fn in steps:
        if not wanted:
            continue
        if b.late():
            b.emit({"kind": "skipped", "variant": name, "why": "deadline"})
            continue
        try:
            fn()
        except Exception as exc:
            b.emit({"kind": "error", "variant": name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    engine.close()


def measure_sync(b: Bench, engine, weights: dict[str, torch.Tensor]) -> None:
    bf16 = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    for label, sd, reps in (("fp32 on GPU (actor)", weights, 5), ("bf16 on GPU", bf16, 3)):
        times, parts = [], []
        for _ in range(reps):
            t, _ = b.timed(lambda sd=sd: engine.load_weights(sd))
            times.append(t)
            parts.append(engine.last_sync)
        b.emit({"kind": "sync", "variant": label, "seconds_median": statistics.median(times), "seconds_all": times,
                "last": parts[-1]})
    del bf16


def measure_checks(b: Bench, engine, weights: dict[str, torch.Tensor]) -> None:
    """Generation reflects new weights; restoring the weights restores the model; after a sync the prefix cache
    serves nothing computed before it.

    Sampled tokens are a fragile witness of the weights: a random-init model's next-token distribution is nearly
    flat, so a last-bit difference in one logit (a different kernel split, a different CUDA graph) changes a
    draw and every token after it. So the weights are judged by teacher forcing: the log-probs vLLM computes for
    one fixed token sequence (prompt_logprobs) with the original, other, and restored weights. The sampled-token
    comparisons are reported beside it, with the same-weights repeat that says how reproducible vLLM's sampling
    is run to run without any sync."""
    ids, mask = b.prompts(8, b.vocab, 1)
    engine.load_weights(weights)
    before = engine.generate(ids, mask, seed=3)
    cached_first = engine.last_cached_tokens
    repeat_cached = engine.generate(ids, mask, seed=3)
    cached_repeat = engine.last_cached_tokens
    engine.llm.reset_prefix_cache()
    repeat_fresh = engine.generate(ids, mask, seed=3)
    scored = [torch.cat([p, r[:-1]]).tolist() for p, r in zip(ids.cpu(), before)]  # < max_model_len: room for 1
    original = score(engine, scored)
    original_again = score(engine, scored)
    other = actor_like_weights(b, seed=1)
    engine.load_weights(other)
    changed = engine.generate(ids, mask, seed=3)
    cached_after_sync = engine.last_cached_tokens
    under_other = score(engine, scored)
    del other
    engine.load_weights(weights)
    restored = engine.generate(ids, mask, seed=3)
    cached_after_restore = engine.last_cached_tokens
    under_restored = score(engine, scored)
    gap = lambda a, c: float((a - c).abs().max())  # noqa: E731 -- max |delta log p| over every scored token
    b.emit({"kind": "checks", "variant": "vllm-engine",
            "new_weights_change_output": not torch.equal(before, changed),
            "restored_weights_reproduce_output": torch.equal(before, restored),
            "same_weights_reproduce_output_cached": torch.equal(before, repeat_cached),
            "same_weights_reproduce_output_fresh": torch.equal(before, repeat_fresh),
            "first_divergence_restored": first_divergence(before, restored),
            "first_divergence_repeat_fresh": first_divergence(before, repeat_fresh),
            "logprob_gap_same_weights": gap(original, original_again),
            "logprob_gap_restored": gap(original, under_restored),
            "logprob_gap_other_weights": gap(original, under_other),
            "restored_weights_restore_the_model": restored_like_original(gap(original, original_again),
                                                                         gap(original, under_restored),
                                                                         gap(original, under_other)),
            "cached_tokens_first": cached_first, "cached_tokens_repeat": cached_repeat,
            "cached_tokens_after_sync": cached_after_sync, "cached_tokens_after_restore": cached_after_restore})


def restored_like_original(same: float, restored: float, other: float) -> bool:
    """Restored weights score like the original ones: their max |delta log p| is within twice (plus 0.01) what the
    same weights show between two identical scoring calls (vLLM's own run-to-run noise, ~0.03 at 0.5B on an H100),
    and a tenth of what other weights show."""
    return restored <= 2 * same + 0.01 and restored * 10 < other


def score(engine, sequences: list[list[int]]) -> torch.Tensor:
    """Teacher-forced log-probs [N, L-1] (fp32) of each sequence's tokens 1.. under the engine's current weights
    (vLLM's prompt_logprobs, one forward with no sampling; the prefix cache is reset first so nothing is reused)."""
    engine.llm.reset_prefix_cache()
    params = engine._SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    outs = engine.llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    return torch.tensor([[pos[tok].logprob for tok, pos in zip(s[1:], o.prompt_logprobs[1:])]
                         for s, o in zip(sequences, outs)])


def first_divergence(a: torch.Tensor, c: torch.Tensor) -> float | None:
    """Mean over rows of the first response position where two [B, R] token tensors differ (None: identical)."""
    differ = a != c
    if not bool(differ.any()):
        return None
    first = torch.where(differ.any(1), differ.int().argmax(1), torch.full((a.shape[0],), a.shape[1]))
    return float(first.float().mean())


def vllm_throughput(b: Bench, engine, batch: int, top_p: float) -> None:
    r = b.args.new_tokens
    engine.spec = vllm_spec(b, top_p)
    SP = engine._SamplingParams

    def plain(seeded: bool, ids: torch.Tensor, logprobs: bool = False) -> int:
        prompts = [{"prompt_token_ids": row.tolist()} for row in ids.cpu()]
        base = dict(temperature=1.0, top_p=top_p, max_tokens=r, ignore_eos=True, detokenize=False)
        if logprobs:  # what the engine asks for: the drawn token's log-prob, flat
            base |= dict(logprobs=0, flat_logprobs=True)
        params = [SP(seed=i, **base) for i in range(batch)] if seeded else SP(**base)
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def ours(ids: torch.Tensor, mask: torch.Tensor) -> int:
        return engine.generate(ids, mask, seed=0).numel()  # fixed length: every position is a generated token

    calls = {"vllm-plain": lambda ids, mask: plain(False, ids), "vllm-seeded": lambda ids, mask: plain(True, ids),
             "vllm-logprobs": lambda ids, mask: plain(True, ids, logprobs=True), "vllm-engine": ours}
    variants = [v for v in b.args.variant_list if v in calls] or list(calls)
    ids, mask = b.prompts(batch, b.vocab, 100)
    engine.llm.reset_prefix_cache()
    first = b.timed(lambda: calls[variants[0]](ids, mask))[0]  # warm-up at this batch size
    times: dict[str, list[float]] = {v: [] for v in variants}
    tokens: dict[str, int] = {}
    for rep in range(b.args.repeats):
        ids, mask = b.prompts(batch, b.vocab, rep)
        for v in variants:
            engine.llm.reset_prefix_cache()  # every call runs its own prefill
            t, n = b.timed(lambda v=v, ids=ids, mask=mask: calls[v](ids, mask))
            times[v].append(t)
            tokens[v] = n
    for v in variants:
        b.throughput(v, batch, top_p, times[v], tokens[v], first if v == variants[0] else None)


def measure_sleep(b: Bench, engine, weights: dict[str, torch.Tensor]) -> None:
    """Device memory (NVML, all processes) with the engine awake, asleep (level 2), and after the wake-up sync."""
    engine.load_weights(weights)
    b.sync()
    awake = used_gib(b.device.index or 0)
    t_sleep = b.timed(engine.sleep)[0]
    asleep = used_gib(b.device.index or 0)
    t_wake = b.timed(lambda: engine.load_weights(weights))[0]
    after = used_gib(b.device.index or 0)
    b.emit({"kind": "sleep", "variant": "vllm-engine", "used_awake_gib": awake, "used_asleep_gib": asleep,
            "used_after_wake_gib": after, "freed_gib": None if awake is None else awake - asleep,
            "sleep_s": t_sleep, "wake_and_sync_s": t_wake, "wake_breakdown": engine.last_sync})


# --------------------------------------------------------------------------- main


def table(b: Bench) -> None:
    rows = [r for r in b.rows if r.get("kind") == "throughput"]
    print()
    print(f"{b.args.model} {b.info['dtype']}, prompt {b.args.prompt_len}, new tokens {b.args.new_tokens}, "
          f"{b.info['device']}, torch {torch.__version__}")
    print("| variant | batch | top_p | tokens/s | s per call (median) | first call s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for x in rows:
        first = f"{x['first_call_s']:.1f}" if x.get("first_call_s") is not None else "-"
        print(f"| {x['variant']} | {x['batch']} | {x['top_p']} | {x['tokens_per_s']:,.0f} | "
              f"{x['seconds_median']:.3f} | {first} |")
    for x in b.rows:
        if x.get("kind") == "profile":
            print(f"profile {x['variant']} b{x['batch']} p{x['top_p']}: {x['wall_us_per_step']:.0f} us/step wall, "
                  f"{x['kernel_us_per_step']:.0f} us of kernels, {x['kernels_per_step']:.0f} kernels/step")
            for name, us in sorted(x["by_category_us"].items(), key=lambda kv: -kv[1]):
                print(f"    {name:28s} {us:8.1f} us")
            for k in x["top"][:12]:
                print(f"    {k['us_per_step']:8.1f} us  x{k['calls_per_step']:<5.0f} {k['name'][:90]}")
        elif x.get("kind") in ("error", "skipped"):
            print(f"{x['kind']}: {x.get('variant')} {x.get('batch', '')} {x.get('error') or x.get('why')}")
    if b.device.type == "cuda":
        print(f"peak GPU memory of this process: {torch.cuda.max_memory_allocated(b.device) / 2**30:.1f} GiB")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", default="256", help="comma-separated batch sizes")
    ap.add_argument("--top-p", default="1.0", help="comma-separated top_p values")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="", help=f"hf: {','.join(HF_VARIANTS)}; vllm: {','.join(VLLM_VARIANTS)}")
    ap.add_argument("--profile", action="store_true", help="hf: profile decode steps of the fast variant")
    ap.add_argument("--sync", action="store_true", help="vllm: weight-sync time")
    ap.add_argument("--checks", action="store_true", help="vllm: new weights change output; prefix cache reset")
    ap.add_argument("--sleep", action="store_true", help="vllm: device memory awake/asleep, sleep and wake times")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--deadline-s", type=float, default=0.0)
    ap.add_argument("--jsonl", default="", help="append every measurement to this file")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny model, small shapes")
    args = ap.parse_args(argv)
    if args.quick:
        args.engine, args.model, args.device, args.batch, args.top_p = "hf", "tiny", "cpu", "4", "1.0,0.9"
        args.prompt_len, args.new_tokens, args.repeats, args.profile = 8, 8, 1, True
        args.variants = args.variants or "graphs,fast,generate-static,cb"
    args.batches = [int(x) for x in args.batch.split(",")]
    args.top_ps = [float(x) for x in args.top_p.split(",")]
    default = "fast" if args.engine == "hf" else ",".join(VLLM_VARIANTS)
    args.variant_list = [v for v in (args.variants or default).split(",") if v]
    allowed = HF_VARIANTS if args.engine == "hf" else VLLM_VARIANTS
    bad = [v for v in args.variant_list if v not in allowed]
    if bad:
        ap.error(f"--variants {','.join(bad)}: not a {args.engine} variant (choose from {','.join(allowed)})")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu (or --quick)")
    b = Bench(args)
    print(json.dumps({"kind": "info", **b.info}), flush=True)
    (run_vllm if args.engine == "vllm" else run_hf)(b)
    table(b)


if __name__ == "__main__":
    main()
