"""Padded against packed training: the actor's update (`ActorWorker.update`, FSDP2, world size 1) on one mini-batch
whose responses are spread over a range of lengths, as a rollout leaves them.

    PYTHONPATH=runtime python bench/packing.py --model qwen2-0.5b            # the GPU figure (issue 31)
    PYTHONPATH=runtime python bench/packing.py --quick                        # tiny model on the CPU (the test's)

The mini-batch: --batch sequences of --prompt-len prompt tokens and a response of a length drawn uniformly from
--min-response..--max-response (seeded), right-padded to the longest. Variants, each a fresh actor on the same batch:
  - `padded`: micro-batches of --micro rows, padded to the longest response (spec.trainer as before);
  - `packed`: the same micro-batches, each packed into one row of real tokens (spec.trainer.packing);
  - `budget`: packed micro-batches cut by tokens (spec.trainer.maxTokensPerMicroBatch) at the padded micro-batch's
    own size, --micro x (prompt + longest response) token slots: the same activation memory, no slot wasted.
Train tokens/s counts real tokens (prompt + response) only. Padding waste is the share of slots that hold no token:
of the padded training batch, and of the rollout's decode steps (every row decodes to the longest response).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from kuberl.data.batch import Batch  # noqa: E402
from kuberl.spec import JobSpec  # noqa: E402
from kuberl.training import dist as kdist  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402


def spread_batch(b: int, p: int, lengths: torch.Tensor, vocab: int, seed: int) -> Batch:
    """b rows of p prompt tokens and responses of `lengths` [b] tokens, right-padded (pad id 0) to the longest."""
    g = torch.Generator().manual_seed(seed)
    r = int(lengths.max())
    prompts, responses = torch.randint(2, vocab, (b, p), generator=g), torch.randint(2, vocab, (b, r), generator=g)
    rmask = (torch.arange(r)[None] < lengths[:, None]).float()
    responses = responses * rmask.long()
    return Batch({
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.long), rmask.long()], 1),
        "responses": responses, "response_mask": rmask, "old_logprobs": torch.full((b, r), -12.0),
        "advantages": torch.randn(b, r, generator=g), "ref_logprobs": torch.full((b, r), -12.0),
    }, {"kl_coef": [0.0] * b})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=64, help="sequences in the mini-batch (one optimizer step)")
    ap.add_argument("--micro", type=int, default=8, help="rows per padded micro-batch")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--min-response", type=int, default=32)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="padded,packed,budget")
    ap.add_argument("--quick", action="store_true", help="tiny model on the CPU, 2 reps")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.quick:
        args.model, args.device, args.batch, args.micro = "tiny", "cpu", 16, 4
        args.prompt_len, args.min_response, args.max_response, args.reps = 8, 2, 24, 2
    cuda = args.device == "cuda"
    b, p = args.batch, args.prompt_len
    lengths = torch.randint(args.min_response, args.max_response + 1, (b,), generator=torch.Generator().manual_seed(0))
    r = int(lengths.max())
    real = int(b * p + lengths.sum())
    trainer = {"padded": {"microBatchSize": args.micro}, "packed": {"microBatchSize": args.micro, "packing": True},
               "budget": {"maxTokensPerMicroBatch": args.micro * (p + r)}}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows: dict[str, dict] = {}
    for name in args.variants.split(","):
        spec = JobSpec.model_validate({
            "model": {"builtin": args.model, "dtype": "bfloat16" if cuda else "float32"},
            "data": {"task": "repeat-letter", "batchSize": b, "maxPromptLength": p},
            "rollout": {"maxNewTokens": r},
            "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
            "trainer": {"miniBatchSize": b, **trainer[name]},
            "roles": {"actor": {"gpus": 1 if cuda else 0, "optim": {"lr": 1e-6}}},
        })
        group = LocalWorkerGroup("actor", spec, args.device)
        try:
            group.start()
            worker = group.worker
            batch = spread_batch(b, p, lengths, worker.trainer.model.config.vocab_size, seed=1).to(worker.device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            stats = [worker.update(batch, 0), worker.update(batch, 1)]  # the first calls compile and warm up
            times = []
            for step in range(2, args.reps + 2):
                sync()
                t0 = time.perf_counter()
                stats.append(worker.update(batch, step))
                sync()
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            rows[name] = {"s": t, "train_tokens_per_s": real / t, "s_all": times, "pg_loss_first": stats[0]["pg_loss"],
                          "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0}
            print(json.dumps({"variant": name, **rows[name]}), flush=True)
        finally:
            group.shutdown()
    waste_train = 1 - real / (b * (p + r))
    waste_rollout = 1 - float(lengths.sum()) / (b * r)
    print()
    print(f"{args.model} on {args.device}: one actor update of {b} sequences, {p} prompt + {args.min_response}.."
          f"{args.max_response} response tokens (longest {r}); {real:,} real tokens in {b * (p + r):,} padded slots")
    print(f"padding waste: training batch {waste_train:.1%}, rollout decode steps {waste_rollout:.1%}")
    print("| variant | s per update | train tokens/s | vs padded | first update's pg_loss | peak GPU GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = rows.get("padded", {}).get("train_tokens_per_s")
    for name, x in rows.items():
        ratio = f"{x['train_tokens_per_s'] / base:.2f}x" if base else "-"
        print(f"| {name} | {x['s']:.3f} | {x['train_tokens_per_s']:,.0f} | {ratio} | {x['pg_loss_first']:.6f} "
              f"| {x['gpu_peak_gib']:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "padding_waste_train": waste_train,
                                               "padding_waste_rollout": waste_rollout}, indent=1))
    if kdist.dist.is_initialized():
        kdist.dist.destroy_process_group()


if __name__ == "__main__":
    main()
