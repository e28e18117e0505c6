"""Peak GPU memory of actor + ref + critic on one GPU (colocateWith), against the three run apart.

    PYTHONPATH=runtime python3 bench/colocation.py                      # H200: qwen2-0.5b, bf16, apart + offload
    PYTHONPATH=runtime python3 bench/colocation.py --modes free          # idleMemory free alone (its own process)
    PYTHONPATH=runtime python3 bench/colocation.py --model qwen2-1.5b    # bigger shape, slower to build
    PYTHONPATH=runtime python3 bench/colocation.py --quick               # CPU smoke (tiny model, no memory figures)

In-process (LocalWorkerGroup, no Ray), full PPO steps through the runtime's Driver; the runs (`--modes`):

- apart: no colocation. In-process the calls run one at a time, so every byte a call leaves allocated
  (or frees) belongs to its role: each role's resident memory is tracked call by call, and its own peak
  is its resident memory before a call plus what the call allocated on top. A role's peak is what it
  needs on a GPU of its own; `apart_sum` is what the three GPUs hold together, `apart_max` the largest.
  The run's own peak is `shared_no_policy`: the three roles on one GPU with all their state resident.
- colocated offload: ref and critic colocateWith the actor, idleMemory offload (the default): between
  its phases each role's weights and optimizer state sit in host memory.
- colocated free (`--modes` free): idleMemory free (only gathered weights and the allocator's cache are
  released between phases). Each run costs a model build (about 23 s for qwen2-0.5b on the H200).

Prints one JSON line per run (peak allocated and reserved GiB, per-role peaks, step seconds, losses) and
a table; the colocated runs' losses are compared with apart's (the memory policy must not change them).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo_step import build_spec, write_prompts  # noqa: E402

from kuberl.controller.driver import Driver  # noqa: E402
from kuberl.spec import JobSpec  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402

SHARED = ("actor", "critic", "ref")
LOSSES = ("pg_loss", "vf_loss", "kl", "reward_mean")
GIB = 2**30


class Meter:
    """GPU memory of one process, by role: each role's resident bytes and the peak it reached."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.resident: dict[str, int] = {}
        self.role_peak: dict[str, int] = {}
        self.base = self.allocated()  # left by earlier runs in this process: not this run's
        self.peak = self.reserved = 0

    def allocated(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else 0

    def around(self, role: str, fn):
        """Run `fn` (a role's call, run to its end in-process) and book what it allocated to `role`."""
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = self.allocated()
        out = fn()
        if self.cuda:
            torch.cuda.synchronize()
        top = torch.cuda.max_memory_allocated() if self.cuda else 0
        mine = self.resident.get(role, 0)
        self.role_peak[role] = max(self.role_peak.get(role, 0), mine + top - before)
        self.resident[role] = mine + self.allocated() - before
        self.peak = max(self.peak, top - self.base)
        self.reserved = max(self.reserved, torch.cuda.max_memory_reserved() if self.cuda else 0)
        return out


def metered(meter: Meter):
    class MeteredGroup(LocalWorkerGroup):
        def wait_ready(self) -> None:
            meter.around(self.role, super().wait_ready)

        def _submit(self, fn, info, per_rank, kwargs, fault):
            return meter.around(self.role, lambda: super(MeteredGroup, self)._submit(fn, info, per_rank, kwargs, fault))

    return MeteredGroup


def with_colocation(spec: JobSpec, idle: str | None) -> JobSpec:
    """`spec` with ref and critic colocated with the actor (idleMemory `idle`), or as it is (None)."""
    if idle is None:
        return spec
    doc = spec.model_dump(by_alias=True)
    for role in SHARED:
        doc["roles"][role]["idleMemory"] = idle
        if role != "actor":
            doc["roles"][role]["colocateWith"] = "actor"
    return JobSpec.model_validate(doc)


def run(spec: JobSpec, device: str, out: Path) -> dict:
    meter = Meter(device)
    group = metered(meter)
    driver = Driver(spec, "colocation-bench", out, lambda role: group(role, spec, device), progress=False)
    t0 = time.perf_counter()
    driver.start()
    setup_s = time.perf_counter() - t0
    recs = []
    try:
        for _ in range(spec.trainer.steps):
            recs.append(driver.train_step().flat())
    finally:
        driver.shutdown()
    del driver
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"setup_s": setup_s, "step_s": [r["time_step_s"] for r in recs],
            "peak_gib": meter.peak / GIB, "max_reserved_gib": meter.reserved / GIB,
            "role_peak_gib": {r: meter.role_peak.get(r, 0) / GIB for r in SHARED},
            "losses": [{k: r.get(k) for k in LOSSES} for r in recs]}


def max_loss_diff(a: dict, b: dict) -> float:
    return max(abs(x[k] - y[k]) for x, y in zip(a["losses"], b["losses"]) for k in LOSSES
               if x[k] is not None and y[k] is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="prompts (= sequences) per step")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8, help="sequences per forward/backward")
    ap.add_argument("--modes", default="apart,offload", help="runs, comma-separated: apart, offload, free")
    ap.add_argument("--quick", action="store_true", help="CPU smoke: tiny model, 2 steps, small batch")
    ap.add_argument("--json", default="", help="also write every run's figures to this file")
    args = ap.parse_args()
    if args.quick:
        args.model, args.device, args.steps, args.batch, args.prompt_len, args.response_len, args.micro = (
            "tiny", "cpu", 2, 8, 16, 8, 4)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --quick (CPU)")
    modes = args.modes.split(",")
    opts = SimpleNamespace(device=args.device, model=args.model, prompt_len=args.prompt_len, batch=args.batch,
                           engine="hf", response_len=args.response_len, no_fast_rollout=True,
                           gpu_memory_utilization=0.25, no_sleep=False, steps=args.steps, mini=0, micro=args.micro)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        write_prompts(data, max(256, args.batch * (args.steps + 1)), args.prompt_len)
        base = build_spec(opts, data)
        for mode in modes:
            spec = with_colocation(base, None if mode == "apart" else mode)
            row = run(spec, args.device, Path(tmp) / mode)
            if mode == "apart":
                row["apart_sum_gib"] = sum(row["role_peak_gib"].values())
                row["apart_max_gib"] = max(row["role_peak_gib"].values())
            if "apart" in rows:
                row["max_loss_diff_vs_apart"] = max_loss_diff(rows["apart"], row)
            rows[mode] = row
            device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
            print(json.dumps({"mode": mode, "model": args.model, "device": device, **row}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print()
    print(f"{args.model} on {args.device}: {args.batch} x ({args.prompt_len} + {args.response_len}) tokens per step, "
          f"micro {args.micro}, {args.steps} steps")
    print("| run | peak allocated GiB | max reserved GiB | actor / critic / ref peak GiB | loss diff vs apart |")
    print("| --- | --- | --- | --- | --- |")
    for mode, row in rows.items():
        peaks = " / ".join(f"{row['role_peak_gib'][r]:.2f}" for r in SHARED)
        diff = row.get("max_loss_diff_vs_apart")
        print(f"| {mode} | {row['peak_gib']:.2f} | {row['max_reserved_gib']:.2f} | {peaks} | "
              f"{'-' if diff is None else f'{diff:.2e}'} |")
    if "apart" in rows:
        a = rows["apart"]
        print(f"apart on three GPUs: {a['apart_sum_gib']:.2f} GiB in all, the largest {a['apart_max_gib']:.2f} GiB; "
              f"the three resident on one GPU without a policy: {a['peak_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
