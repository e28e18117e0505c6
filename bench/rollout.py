"""Rollout throughput of the `hf` engine: transformers `generate` against the static-cache CUDA-graph
path, on the same model, prompts and sampling settings, in one process (ratios come from one run).

    PYTHONPATH=runtime python bench/rollout.py --model qwen2-0.5b --batch 256 --prompt-len 128 --new-tokens 256
    PYTHONPATH=runtime python bench/rollout.py --model tiny --device cpu --batch 8 --prompt-len 16 --new-tokens 16   # smoke

Variants: `generate` (transformers 5 `model.generate`, sampling, fixed length via min_new_tokens),
`graphs` (StaticDecoder: static KV cache, decode step in one CUDA graph), `inductor` (the same with
the per-layer parts of the step compiled by torch.compile), `inductor-top-p` (inductor with
top_p=0.9: adds a sort of the vocabulary per step). Every variant emits exactly --new-tokens tokens
per sequence (EOS suppressed), so tokens/s = batch x new tokens / seconds. The model is a random-init
built-in shape in bf16 (fp32 on CPU). First calls (capture, compilation) are timed apart.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from kuberl.models import char_tokenizer, load_causal_lm  # noqa: E402
from kuberl.rollout.fast import SamplingParams, StaticDecoder  # noqa: E402
from kuberl.spec.model import ModelSource  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device) -> tuple[float, torch.Tensor]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="generate,graphs,inductor,inductor-top-p")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tok = char_tokenizer()
    model = load_causal_lm(ModelSource(builtin=args.model), dtype=dtype, device=device).to(device).eval()
    model.requires_grad_(False)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (args.batch, args.prompt_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    b, r = args.batch, args.new_tokens
    tokens = b * r
    variants = [v for v in args.variants.split(",") if v]
    rows: list[dict] = []
    info = {"machine": platform.node(), "torch": torch.__version__, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "model": args.model, "dtype": str(dtype), "batch": b, "prompt_len": args.prompt_len, "new_tokens": r}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    print(json.dumps(info), flush=True)

    def add(name: str, times: list[float], first: float | None = None, note: str = "") -> None:
        med = statistics.median(times)
        row = {"variant": name, "tokens_per_s": tokens / med, "seconds_median": med, "seconds_all": times,
               "first_call_s": first, "note": note}
        rows.append(row)
        print(json.dumps(row), flush=True)

    if "generate" in variants:
        def run_generate(n: int) -> torch.Tensor:
            return model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                  max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        timed(lambda: run_generate(4), device)  # warm-up (kernels, allocator)
        reps = 1 if device.type == "cuda" else args.repeats  # ~17 s per run at the default shape on an H200
        times = []
        for _ in range(reps):
            t, out = timed(lambda: run_generate(r), device)
            assert out.shape == (b, args.prompt_len + r), out.shape
            times.append(t)
        add("generate", times, note="transformers generate, DynamicCache, eager")

    dec = None
    fixed = SamplingParams(temperature=1.0, top_p=1.0, suppress_eos=True)
    for name in ("graphs", "inductor", "inductor-top-p"):
        if name not in variants:
            continue
        if dec is None:
            dec = StaticDecoder(model, tok.pad_token_id, tok.eos_token_id, compile=False)
        if name.startswith("inductor") and not dec.compiled:
            if device.type != "cuda":
                print(json.dumps({"variant": name, "skipped": "inductor variants are for CUDA"}), flush=True)
                continue
            dec.enable_compile()
        sp = fixed if name != "inductor-top-p" else SamplingParams(temperature=1.0, top_p=0.9, suppress_eos=True)
        torch.manual_seed(0)
        first, out = timed(lambda: dec.generate(ids, mask, r, sp), device)
        assert out.shape == (b, r) and not bool((out == tok.eos_token_id).any())
        times = [timed(lambda: dec.generate(ids, mask, r, sp), device)[0] for _ in range(args.repeats)]
        add(name, times, first, note=f"StaticDecoder graphs={dec.use_graphs} compiled={dec.compiled} top_p={sp.top_p}")

    base = next((x for x in rows if x["variant"] == "generate"), None)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    print()
    print(f"{args.model} {dtype}, batch {b}, prompt {args.prompt_len}, new tokens {r}, {info['device']}, torch {torch.__version__}")
    print("| variant | tokens/s | s per call (median) | first call s | x generate |")
    print("| --- | --- | --- | --- | --- |")
    for x in rows:
        ratio = f"{x['tokens_per_s'] / base['tokens_per_s']:.1f}" if base else "-"
        first = f"{x['first_call_s']:.1f}" if x["first_call_s"] is not None else "-"
        print(f"| {x['variant']} | {x['tokens_per_s']:,.0f} | {x['seconds_median']:.3f} | {first} | {ratio} |")
    print(f"peak GPU memory: {peak:.1f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "rows": rows, "peak_gib": peak}, indent=1))


if __name__ == "__main__":
    main()
