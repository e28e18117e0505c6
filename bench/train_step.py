"""The actor's training step alone: `ActorWorker.update` (FSDP2, world size 1) on one mini-batch.

    PYTHONPATH=runtime python bench/train_step.py --model qwen2-0.5b --profile
    PYTHONPATH=runtime python bench/train_step.py --model tiny --device cpu --micro 4 --prompt-len 8 --response-len 8

Builds only the actor (through LocalWorkerGroup, as a job does) and times one optimizer step on
--micro sequences of --prompt-len + --response-len tokens (default 16 x 512): forward, PPO loss,
backward, grad clip, AdamW. Variants, in one process, each a fresh actor built with its own
`KernelOptions`: `runtime` (as a job runs it: compiled blocks on CUDA, fused LM head + log-softmax
with its chunk math compiled), `eager-head` (the chunk math not compiled), `eager` (blocks not
compiled either), `eager-logits` (the logits path instead of the fused head too). All share FSDP2
setup and fused AdamW. MFU is against the bf16 matmul peak measured in this run.
--profile prints, for `runtime`, the top ops by CUDA time and by CPU time over two profiled steps.

--setups runs each variant once per memory setting of the actor (`spec.roles.actor`): none; optimizer
(offload.optimizer: AdamW moments streamed from pinned host memory); params (offload.params +
optimizer: FSDP2 CPUOffloadPolicy, the step on the CPU); lora (rank-16 adapters on every linear layer
of the blocks, the rest frozen). Each row has its own peak GPU memory and trainable parameter count;
a setting that does not fit is a row with "oom": true. --accum N takes N micro-batches per step.

    python bench/train_step.py --model qwen2-1.5b --variants runtime --setups none,optimizer,params,lora --reps 3
    python bench/train_step.py --model qwen2-7b --variants runtime --setups optimizer --micro 8 --accum 2 --reps 2
    python bench/train_step.py --quick   # tiny model on CPU, every setting (what the test runs)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from kuberl.data.batch import Batch  # noqa: E402
from kuberl.spec import JobSpec  # noqa: E402
from kuberl.training import dist as kdist  # noqa: E402
from kuberl.training.kernels import KernelOptions  # noqa: E402
from kuberl.training.models import builtin_config  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_step import model_flops  # noqa: E402

# --setups names -> fields of spec.roles.actor
SETUPS = {"none": {}, "optimizer": {"offload": {"optimizer": True}},
          "params": {"offload": {"params": True, "optimizer": True}},
          "lora": {"lora": {"rank": 16, "alpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "gate_proj", "up_proj", "down_proj"]}}}


def main() -> None:  # noqa: C901 -- the bench's flags and its report, one branch each
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b", "qwen2-7b"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=384)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--variants", default="runtime,eager-head,eager,eager-logits")
    ap.add_argument("--setups", default="none", help=f"comma-separated, of: {', '.join(SETUPS)}")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny model on CPU, every setting, one rep")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.quick:
        args.model, args.device, args.micro, args.prompt_len, args.response_len = "tiny", "cpu", 4, 8, 8
        args.reps, args.variants, args.setups, args.accum = 1, "runtime", ",".join(SETUPS), 2
    cuda = args.device == "cuda"
    b = args.micro * args.accum

    def spec_for(setup: str) -> JobSpec:
        return JobSpec.model_validate({
            "model": {"builtin": args.model, "dtype": "bfloat16" if cuda else "float32"},
            "data": {"task": "repeat-letter", "batchSize": b},
            "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "trainer": {"miniBatchSize": b, "microBatchSize": args.micro},
            "roles": {"actor": {"gpus": 1 if cuda else 0, "optim": {"lr": 1e-6}, **SETUPS[setup]}},
        })

    runtime = KernelOptions.for_device(torch.device(args.device))
    kernels = {"runtime": runtime, "eager-head": replace(runtime, compile_head=False),
               "eager": replace(runtime, compile_head=False, compile_blocks=False),
               "eager-logits": replace(runtime, compile_head=False, compile_blocks=False, fused_head=False)}
    p, r = args.prompt_len, args.response_len
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    flops = model_flops(builtin_config(args.model), b, p + r, r)["total"]
    tokens = b * (p + r)
    rows: dict[str, dict] = {}
    peak = 0.0

    def run_variant(name: str, setup: str) -> None:
        """A fresh actor built with this variant's kernels (KernelOptions) and setup, timed on the same batch."""
        row = f"{name}/{setup}" if setup != "none" or len(setups) > 1 else name
        group = LocalWorkerGroup("actor", spec_for(setup), args.device, kernels=kernels[name])
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            group.start()
            time_variant(row, group.worker)
            rows[row]["gpu_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
            rows[row]["setup"] = SETUPS[setup]
            rows[row]["trainable_params"] = sum(p.numel() for p in group.worker.trainer.model.parameters()
                                                if p.requires_grad)
            print(json.dumps({"variant": row, **rows[row]}), flush=True)
        except torch.OutOfMemoryError as exc:
            rows[row] = {"oom": True, "setup": SETUPS[setup],
                         "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30, "error": str(exc).split("\n")[0]}
            print(json.dumps({"variant": row, **rows[row]}), flush=True)
        finally:
            group.shutdown()
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()

    def time_variant(name: str, worker) -> None:
        nonlocal peak
        if not peak:
            peak = worker.measure_peak_flops()
        n = worker.num_params()
        g = torch.Generator().manual_seed(1)
        vocab = worker.trainer.model.config.vocab_size
        prompts, responses = torch.randint(2, vocab, (b, p), generator=g), torch.randint(2, vocab, (b, r), generator=g)
        batch = Batch({
            "input_ids": torch.cat([prompts, responses], 1), "attention_mask": torch.ones(b, p + r, dtype=torch.long),
            "responses": responses, "response_mask": torch.ones(b, r), "old_logprobs": torch.full((b, r), -12.0),
            "advantages": torch.randn(b, r, generator=g), "ref_logprobs": torch.full((b, r), -12.0),
        }, {"kl_coef": [0.0] * b}).to(worker.device)
        t0 = time.perf_counter()
        worker.update(batch, 0)
        sync()
        first = time.perf_counter() - t0
        worker.update(batch, 1)
        times = []
        for step in range(2, args.reps + 2):  # a step of its own each: a trainer applies one update per step
            sync()
            t0 = time.perf_counter()
            worker.update(batch, step)
            sync()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        rows[name] = {"ms": t * 1e3, "first_call_s": first, "tokens_per_s": tokens / t,
                      "mfu_6nt": 6 * n * tokens / t / peak, "mfu_strict": flops / t / peak,
                      "ms_all": [x * 1e3 for x in times], "n_params": n,
                      "kernels": asdict(kernels[name.split("/")[0]])}
        if args.profile and name == "runtime" and cuda:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for step in range(args.reps + 2, args.reps + 4):
                    worker.update(batch, step)
                sync()
            events = prof.key_averages()
            print(f"profile ({name}), 2 steps of {t * 1e3:.1f} ms each (the table's totals cover both):", flush=True)
            print(events.table(sort_by="self_device_time_total", row_limit=22, max_name_column_width=70), flush=True)
            print(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70), flush=True)

    print(json.dumps({"model": args.model, "tokens": tokens, "torch": torch.__version__}), flush=True)
    setups = args.setups.split(",")
    for name in args.variants.split(","):
        for setup in setups:
            run_variant(name, setup)
    gpu_peak = max((x["gpu_peak_gib"] for x in rows.values()), default=0.0)
    print()
    print(f"{args.model}, actor update on {b} x {p + r} tokens ({r} response) in micro-batches of {args.micro}, "
          f"one AdamW step, FSDP2 world size 1; matmul peak this run {peak / 1e12:.0f} TFLOP/s")
    print("| variant | ms | tokens/s | MFU 6·N·T | MFU strict | first call s | peak GPU GiB | trainable params |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, x in rows.items():
        if x.get("oom"):
            print(f"| {name} | out of memory | | | | | {x['gpu_peak_gib']:.1f} when it failed | |")
            continue
        print(f"| {name} | {x['ms']:.1f} | {x['tokens_per_s']:,.0f} | {x['mfu_6nt']:.1%} | {x['mfu_strict']:.1%} "
              f"| {x['first_call_s']:.1f} | {x['gpu_peak_gib']:.1f} | {x['trainable_params']:,} |")
    if args.json:
        out = {"args": vars(args), "peak_tflops": peak / 1e12, "rows": rows, "gpu_peak_gib": gpu_peak}
        Path(args.json).write_text(json.dumps(out, indent=1))
    if kdist.dist.is_initialized():
        kdist.dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
