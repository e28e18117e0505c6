"""Full PPO steps through the runtime's own Driver, in-process (LocalWorkerGroup, no Ray), on one device.

    PYTHONPATH=runtime python bench/ppo_step.py --model qwen2-0.5b          # H200: 0.5B shape, bf16
    PYTHONPATH=runtime python bench/ppo_step.py --model qwen2-1.5b
    PYTHONPATH=runtime python bench/ppo_step.py --model qwen2-0.5b --engine vllm [--no-sleep]   # vLLM rollout
    PYTHONPATH=runtime python bench/ppo_step.py --model qwen2-0.5b --asynchronous   # rollout.asynchronous
    PYTHONPATH=runtime python bench/ppo_step.py --model qwen2-0.5b --async-staleness 2   # rollout.async
    PYTHONPATH=runtime python bench/ppo_step.py --model tiny --device cpu --steps 2 --batch 8 --prompt-len 16 \
        --response-len 16   # smoke

Every role (actor with its rollout engine, critic, ref, rule reward) is built by the same worker
classes as in a real job and driven by `Driver.train_step`: rollout, reward, ref, values, advantage,
update_critic, update_actor, weight_sync. Prompts are exactly --prompt-len tokens (the built-in
character tokenizer: one character, one token), responses exactly --response-len (rollout.fixedLength),
so every micro-batch is micro x (prompt + response) tokens with no padding.

Prints per step: time per phase, total step time, rollout tokens/s, training tokens/s, MFU (the
driver's 6·N·tokens estimate and a stricter count of the FLOPs actually done), against the bf16
matmul peak measured in this run (printed), and peak GPU memory. Then, unless --no-train-bench, a
plain actor training step on one micro-batch-sized mini-batch (default 16 x 512 tokens: forward,
backward, clip, fused AdamW step), timed over --train-reps repetitions.
The first step includes torch.compile and CUDA-graph capture; the summary is the median of the steady
steps: not the first, not a step that saved a checkpoint (the last one does), and with --asynchronous not the
last step, which sends no early rollout; 8 steps by default, so that at least 5 remain. Each step's total is
printed, the checkpoint's cost per save on its own line, and every step after the first that took more than
10 % over the steady median is named as a stall.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from kuberl.controller.driver import Driver  # noqa: E402
from kuberl.data.batch import Batch  # noqa: E402
from kuberl.spec import JobSpec  # noqa: E402
from kuberl.training import gcfreeze  # noqa: E402
from kuberl.training.kernels import KernelOptions  # noqa: E402
from kuberl.training.models import CHARS, builtin_config  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from devmem import PeakSampler  # noqa: E402
from stacks import StackSampler  # noqa: E402

PHASES = ("rollout", "reward", "ref", "values", "advantage", "update_critic", "update_actor", "weight_sync", "end_step",
          "other")


def model_flops(cfg, batch: int, seq: int, resp: int) -> dict[str, float]:
    """FLOPs of one forward+backward over `batch` sequences of `seq` tokens whose last `resp` positions
    go through the LM head: dense layers (6 per parameter per token), LM head (6·V·H per head token),
    causal attention scores and values (fwd 2·S²·h·d per layer and sequence, x3 with backward)."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = h // heads
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    dense = 6 * per_layer * layers * batch * seq
    head = 6 * cfg.vocab_size * h * batch * resp
    attn = 6 * seq * seq * heads * d * layers * batch
    return {"dense": dense, "head": head, "attention": attn, "total": dense + head + attn}


def build_spec(args, data_file: Path, checkpoint_interval: int = 10_000) -> JobSpec:
    """The PPO job the benches run; checkpoints every `checkpoint_interval` steps (default: only the last)."""
    gpus = 1 if args.device == "cuda" else 0
    return JobSpec.model_validate({
        "model": {"builtin": args.model, "dtype": "bfloat16" if args.device == "cuda" else "float32"},
        "algorithm": {"name": "ppo", "kl": {"coef": 0.01, "estimator": "k1"}},
        "data": {"files": [str(data_file)], "maxPromptLength": args.prompt_len, "batchSize": args.batch,
                 "shuffle": True},
        "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
        "rollout": {"engine": args.engine, "maxNewTokens": args.response_len, "temperature": 1.0, "topP": 1.0,
                    "fixedLength": True, "compile": args.device == "cuda" and not args.no_fast_rollout,
                    "gpuMemoryUtilization": args.gpu_memory_utilization, "sleepMode": not args.no_sleep,
                    "asynchronous": getattr(args, "asynchronous", False),
                    **({"async": {"maxStaleness": k}} if (k := getattr(args, "async_staleness", 0)) else {})},
        "trainer": {"steps": args.steps, "ppoEpochs": 1, "miniBatchSize": args.mini or args.batch,
                    "microBatchSize": args.micro, "seed": 0,
                    "checkpoint": {"interval": checkpoint_interval}},
        "roles": {"actor": {"gpus": gpus, "optim": {"lr": 1e-6}}, "critic": {"gpus": gpus, "optim": {"lr": 1e-5}},
                  "ref": {"gpus": gpus}, "reward": {"gpus": 0},
                  **({"rollout": {"gpus": gpus}} if getattr(args, "async_staleness", 0) else {})},
        "resilience": {"snapshots": getattr(args, "snapshots", "auto")},
    })


def rollout_path(engine) -> str:
    """hf: which generation path runs; vllm: the engine's mode."""
    if hasattr(engine, "path"):
        return engine.path
    return f"vllm ({'in-process' if engine.in_process else 'engine process'}, sleep mode {engine.sleep_mode})"


def write_prompts(path: Path, n: int, length: int) -> None:
    """Prompts of exactly `length` characters (= tokens), ending in 'say c:'."""
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(n):
        c = rng.choice("abcdef")
        tail = f"say {c}:"
        head = "".join(rng.choice(CHARS[:36]) for _ in range(max(0, length - len(tail))))
        rows.append({"prompt": (head + tail)[-length:], "answer": c})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def train_bench(spec: JobSpec, args, peak: float, n: int) -> dict:
    """A plain actor training step: one optimizer step on a micro x (prompt + response) mini-batch.

    Timed as the runtime runs it (compiled blocks, fused LM head + log-softmax), then with
    compilation off (blocks and head math), and with the logits path instead of the fused head too,
    each on a fresh actor built with those `KernelOptions` (FSDP2 setup and fused AdamW are the same
    in all three), so the effect of each is measured here.
    """
    device = torch.device(args.device)
    runtime = KernelOptions.for_device(device)
    variants = {"runtime": runtime}
    if not args.no_ab:
        eager = replace(runtime, compile_blocks=False, compile_head=False)
        if eager != runtime:
            variants["eager_blocks"] = eager
        variants["eager_blocks_logits_path"] = replace(eager, fused_head=False)
    b, p, r = args.micro, args.prompt_len, args.response_len
    trainer = spec.trainer.model_copy(update={"mini_batch_size": b, "micro_batch_size": b})
    spec = spec.model_copy(update={"trainer": trainer})
    tokens = b * (p + r)
    flops = model_flops(builtin_config(args.model), b, p + r, r)["total"]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def measure(kernels: KernelOptions) -> dict:
        group = LocalWorkerGroup("actor", spec, args.device, kernels=kernels)
        group.start()
        worker = group.worker
        g = torch.Generator().manual_seed(1)
        vocab = worker.trainer.model.config.vocab_size
        prompts = torch.randint(2, vocab, (b, p), generator=g)
        responses = torch.randint(2, vocab, (b, r), generator=g)
        batch = Batch({
            "input_ids": torch.cat([prompts, responses], 1), "attention_mask": torch.ones(b, p + r, dtype=torch.long),
            "responses": responses, "response_mask": torch.ones(b, r), "old_logprobs": torch.full((b, r), -12.0),
            "advantages": torch.randn(b, r, generator=g), "ref_logprobs": torch.full((b, r), -12.0),
        }, {"kl_coef": [0.0] * b}).to(worker.device)
        worker.update(batch, 0)  # warm-up (compilation for this shape, allocator)
        times = []
        for step in range(1, args.train_reps + 1):  # a step of its own each: a trainer applies one update per step
            sync()
            t0 = time.perf_counter()
            worker.update(batch, step)
            sync()
            times.append(time.perf_counter() - t0)
        group.shutdown()
        del worker, batch
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t = statistics.median(times)
        return {"seconds_median": t, "seconds_all": times, "tokens_per_s": tokens / t,
                "mfu_6nt": 6 * n * tokens / t / peak, "mfu_strict": flops / t / peak, "kernels": asdict(kernels)}

    return {"tokens": tokens, **{name: measure(k) for name, k in variants.items()}}


ALLOC_COUNTS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")


def allocator_counts(device: str) -> dict[str, int]:
    """The CUDA caching allocator's running counts of the events that stall the host (a cudaMalloc or cudaFree, a
    retry that frees the cache, a sync of every stream): a step whose counts grew paid for them."""
    if device != "cuda":
        return {}
    stats = torch.cuda.memory_stats()
    return {f"alloc_{k}": stats.get(k, 0) for k in ALLOC_COUNTS}


def graphs_compiled() -> int:
    """torch.compile's graphs compiled so far in this process: a step after the first that adds any recompiled
    something (a guard that failed on a new input), which costs it seconds."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def main() -> None:  # noqa: C901 -- the bench's flags and its report, one branch each
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=8, help="steps (at least 4: the steady median needs two)")
    ap.add_argument("--batch", type=int, default=64, help="prompts (= sequences) per step")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=384)
    ap.add_argument("--mini", type=int, default=0, help="sequences per optimizer step (default: the whole batch)")
    ap.add_argument("--micro", type=int, default=16, help="sequences per forward/backward")
    ap.add_argument("--no-fast-rollout", action="store_true", help="rollout with transformers generate")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout.engine")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.25, help="vllm: its share of the GPU")
    ap.add_argument("--no-sleep", action="store_true", help="vllm: keep the engine's memory during training")
    ap.add_argument("--asynchronous", action="store_true",
                    help="rollout.asynchronous: in-process the calls still run one at a time (docs/performance.md)")
    ap.add_argument("--async-staleness", type=int, default=0,
                    help="rollout.async with this maxStaleness: the rollout role on a thread of its own, in-process on "
                         "the same device (transformers generate)")
    ap.add_argument("--checkpoint-interval", type=int, default=10_000,
                    help="steps between periodic checkpoints (the last step always saves)")
    ap.add_argument("--snapshots", default="auto", choices=["auto", "on", "off"], help="spec.resilience.snapshots")
    ap.add_argument("--out-dir", default=None,
                    help="where the job's output and checkpoints go (default: a temporary folder under $TMPDIR)")
    ap.add_argument("--no-train-bench", action="store_true")
    ap.add_argument("--train-reps", type=int, default=5)
    ap.add_argument("--no-ab", action="store_true", help="time the train step only as the runtime runs it")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="A/B: leave Python's cycle collector as it is "
                         "(no kuberl.training.gcfreeze after the first step)")
    ap.add_argument("--sample-stacks", action="store_true",
                    help="sample every thread's stack each 20 ms; print where each stall's time went")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu")

    if args.no_gc_freeze:
        gcfreeze.settle = lambda: False
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=args.out_dir) as out:
        data = Path(tmp) / "prompts.jsonl"
        write_prompts(data, max(256, args.batch * (args.steps + 1)), args.prompt_len)
        spec = build_spec(args, data, args.checkpoint_interval)
        t0 = time.perf_counter()
        driver = Driver(spec, "ppo-bench", Path(out), lambda role: LocalWorkerGroup(role, spec, args.device),
                        progress=False)
        driver.start()
        setup_s = time.perf_counter() - t0
        engine = driver.groups["actor"].worker.engine
        peak = driver.peak_flops
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        print(json.dumps({"model": args.model, "n_params": driver.n_params, "device": device,
                          "torch": torch.__version__, "matmul_peak_tflops": peak / 1e12,
                          "rollout_path": rollout_path(engine),
                          "kernels": asdict(KernelOptions.for_device(torch.device(args.device))),
                          "setup_s": setup_s, "batch": args.batch, "prompt_len": args.prompt_len,
                          "response_len": args.response_len, "mini": args.mini or args.batch, "micro": args.micro}),
              flush=True)
        recs = []
        try:
            with PeakSampler() as device_mem, StackSampler() if args.sample_stacks else nullcontext() as sampler:
                for step in range(1, args.steps + 1):
                    if sampler is not None:
                        sampler.label = step
                    rec = driver.train_step().flat()
                    recs.append(rec)
                    shown = ("time_", "rollout_tokens", "train_tokens", "mfu", "memory_actor_gpu", "staleness",
                             "response_length")  # below --response-len: an EOS was drawn, so a padded micro-batch
                    keep = {k: v for k, v in rec.items() if k.startswith(shown)}
                    probes = {"graphs_compiled": graphs_compiled(), **allocator_counts(args.device)}
                    print(json.dumps({"step": rec["step"], "at": round(time.time(), 2), **keep, **probes}), flush=True)
            t_last = time.perf_counter()
            driver.roles.commit()  # the last step's checkpoint, written in the background: the job's end waits
            last_write_s = time.perf_counter() - t_last
            skipped = {role: driver.groups[role].worker.trainer.saver.skips for role in ("actor", "critic")
                       if role in driver.groups}  # snapshots skipped while a checkpoint read their slot
        finally:
            driver.shutdown()
        path, n_params = rollout_path(engine), driver.n_params
        del driver, engine  # the roles' models, before the train bench builds its own (1.5B: 80 GB would not hold both)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        tb = None if args.no_train_bench else train_bench(spec, args, peak, n_params)

    cfg = builtin_config(args.model)
    seq = args.prompt_len + args.response_len
    upd_flops = model_flops(cfg, args.batch, seq, args.response_len)["total"]
    saves = [r for r in recs if r.get("time_checkpoint_s")]
    later = [r for r in recs[1:] if not r.get("time_checkpoint_s")] or recs[-1:]
    if args.asynchronous and len(later) > 1 and later[-1] is recs[-1]:
        # in-process the early rollout of step k+1 runs inside step k, and the last step sends none:
        # its wall clock holds no rollout, so it is left out of the median
        later = later[:-1]
    med = lambda key: statistics.median(r.get(key, 0.0) for r in later)  # noqa: E731
    stalls = [r["step"] for r in recs[1:] if r["time_step_s"] > 1.1 * med("time_step_s")]
    gpu_peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0
    summary = {
        "device": device,  # the GPU's name: gpu_check compares a figure with the same device's baseline only
        "steps_in_median": [r["step"] for r in later],
        "phases_s": {p: med(f"time_{p}_s") for p in PHASES},
        "step_s": med("time_step_s"),
        "first_step_s": recs[0]["time_step_s"],
        "steps_s": {r["step"]: r["time_step_s"] for r in recs},
        "checkpoint_s": {r["step"]: r["time_checkpoint_s"] for r in saves},
        "last_checkpoint_write_s": last_write_s,
        "snapshots_skipped": skipped,
        "stalls": stalls,
        "rollout_tokens_per_s": med("rollout_tokens_per_s"),
        "train_tokens_per_s": med("train_tokens_per_s"),
        "mfu_update_actor_6nt": med("mfu"),
        "mfu_update_actor_strict": upd_flops / med("time_update_actor_s") / peak if med("time_update_actor_s") else 0.0,
        "peak_tflops": peak / 1e12,
        "gpu_peak_gib": gpu_peak,
        "device_peak_gib": device_mem.peak_gib,
        "engine": args.engine,
        "sleep_mode": args.engine == "vllm" and not args.no_sleep,
        "train_step": tb,
    }
    print(json.dumps(summary), flush=True)
    print()
    print(f"{args.model}: {args.batch} sequences x ({args.prompt_len} prompt + {args.response_len} response) per step; "
          f"mini {args.mini or args.batch}, micro {args.micro}; rollout path {path}; "
          f"{summary['steps_in_median']} in the median")
    print(f"measured matmul peak (square matmuls in the actor's dtype, this run): {peak / 1e12:.4g} TFLOP/s")
    print("| phase | seconds |")
    print("| --- | --- |")
    for p_, s in summary["phases_s"].items():
        print(f"| {p_} | {s:.3f} |")
    print(f"| **step total** | {summary['step_s']:.3f} (first step, with compile/capture: "
          f"{summary['first_step_s']:.1f}) |")
    print("each step, s: " + ", ".join(f"{k}: {v:.2f}" for k, v in summary["steps_s"].items()))
    print("checkpoint per save, s (its step's training path): "
          + (", ".join(f"step {k}: {v:.2f}" for k, v in summary["checkpoint_s"].items()) or "no save"))
    print(f"the last checkpoint's write after the last step (the job's end waits for it): {last_write_s:.2f} s")
    print(f"snapshots skipped while a checkpoint still read their slot: {skipped}")
    print(f"stalls (a step after the first over 1.1 x the steady median): {stalls or 'none'}")
    if sampler is not None:
        for step in [*stalls, *summary["steps_in_median"][:1]]:
            print(f"where step {step}'s {summary['steps_s'][step]:.2f} s went (stack samples, every thread):")
            print(sampler.report(step))
    print(f"rollout tokens/s: {summary['rollout_tokens_per_s']:,.0f}   "
          f"training tokens/s (actor update): {summary['train_tokens_per_s']:,.0f}")
    print(f"actor update MFU: {summary['mfu_update_actor_6nt']:.1%} (6·N·T, N={n_params / 1e6:.0f}M)   "
          f"{summary['mfu_update_actor_strict']:.1%} (FLOPs actually done)")
    if tb:
        print(f"plain actor train step, {args.micro} x {seq} tokens, one optimizer step (median of {args.train_reps}):")
        print("| variant | ms | tokens/s | MFU 6·N·T | MFU strict |")
        print("| --- | --- | --- | --- | --- |")
        for name, x in tb.items():
            if isinstance(x, dict):
                print(f"| {name} | {x['seconds_median'] * 1e3:.1f} | {x['tokens_per_s']:,.0f} | {x['mfu_6nt']:.1%} "
                      f"| {x['mfu_strict']:.1%} |")
    device_peak = device_mem.peak_gib if device_mem.peak_gib is not None else "n/a"
    print(f"peak GPU memory (all roles, one process): {gpu_peak:.1f} GiB; whole device during the steps "
          f"(NVML, every process): {device_peak} GiB")
    if args.json:
        out = {"args": vars(args), "records": recs, "summary": summary}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
